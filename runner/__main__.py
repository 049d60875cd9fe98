"""`python -m runner [overrides]`: Hydra composes conf/ into the typed config and hands it to run()."""

import math
import os
import sys
import textwrap
import traceback

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from runner.errors import UserError
from runner.report import write_json
from runner.schema import register

register()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg) -> float:
    from runner.run import run  # MindSpore loads only after the config composed cleanly

    try:
        return run(cfg)["val_accuracy"]
    except Exception as e:
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            if not isinstance(e, UserError):
                raise
            # A user's mistake gets one readable paragraph and exit status 2, not a traceback.
            print(textwrap.fill(f"Error: {e}", width=100), file=sys.stderr, flush=True)
            sys.exit(2)
        # In a sweep a failed job is recorded for the summary (runner/sweep.py) and the others go on.
        if isinstance(e, UserError):
            print(textwrap.fill(f"Error: {e}", width=100), file=sys.stderr, flush=True)
        else:
            traceback.print_exc()
        job_dir = HydraConfig.get().runtime.output_dir
        write_json(os.path.join(job_dir, "failed.json"), {"error": str(e), "error_type": type(e).__name__})
        return math.nan


if __name__ == "__main__":
    main()
    from runner.sweep import failed_jobs

    sys.exit(1 if failed_jobs() else 0)
