"""Hydra config groups of the runner; a package so Hydra finds them as pkg://runner.conf when installed."""
