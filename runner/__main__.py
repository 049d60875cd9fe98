"""`python -m runner [overrides]`: Hydra composes conf/ into the typed config and hands it to run()."""

import logging
import math
import os
import sys
import textwrap
import traceback

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from runner.errors import user_errors
from runner.files import write_json
from runner.preflight import check_config_file, check_output_dir
from runner.schema import register
from runner.validate import validate

register()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg) -> float:
    # A log line that cannot be written (disk full) must not print a traceback of its own: the
    # failure that matters is reported as one paragraph below.
    logging.raiseExceptions = False
    try:
        validate(cfg)  # once per process, before anything heavy
        if cfg.dry_run:
            print("Configuration is valid (dry_run=true: nothing was trained).")
            return None
        from runner.run import run  # MindSpore loads only after the config composed cleanly

        metrics = run(cfg)
        return metrics.val_accuracy if metrics is not None else None
    except Exception as e:
        mine = isinstance(e, user_errors())
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            if not mine:
                raise
            _print_user_error(e)
            sys.exit(2)
        # In a sweep a failed job is recorded for the summary (runner/sweep.py) and the others go on.
        if mine:
            _print_user_error(e)
        else:
            traceback.print_exc()
        job_dir = HydraConfig.get().runtime.output_dir
        write_json(os.path.join(job_dir, "failed.json"), {"error": str(e), "error_type": type(e).__name__})
        return math.nan


def _print_user_error(e: Exception) -> None:
    """A user's mistake gets one readable paragraph, not a traceback; paths are never broken."""
    text = textwrap.fill(f"Error: {e}", width=100, break_on_hyphens=False, break_long_words=False)
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    check_output_dir(sys.argv[1:])
    check_config_file(sys.argv[1:])
    main()
    from runner.sweep import failed_jobs

    sys.exit(1 if failed_jobs() else 0)
