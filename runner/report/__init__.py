"""What a run measures and leaves behind: step timing and input shapes (monitor, shapes), FLOPs and
memory (flops), the metrics record (metrics), files, plots and advice (outputs, plots, advice), and
the configured logger (loggers)."""
