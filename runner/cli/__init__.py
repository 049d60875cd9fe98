"""The command line: the Hydra app every command starts from, the checks before Hydra runs, one sweep job a process."""
