"""One sweep job in a fresh process: `python -m runner.cli.job_process JOBFILE` (from hydra_plugins/runner_launcher).

Runs Hydra's own run_job on the composed job config, so the job directory, .hydra/, logging
and the job callbacks are exactly what the basic launcher gives, and writes back the result.
"""

import pickle
import signal
import sys
import traceback

from hydra.core.utils import run_job, setup_globals
from hydra.types import HydraContext


def main(job_file: str) -> None:
    """Load the job, run it through Hydra, pickle (status, value, error, dirs) for the launcher."""
    from runner.cli.app import _on_sigint, job_task
    from runner.cli.hydra_seam import job_callbacks, job_error
    from runner.training.interrupts import route_sigint

    signal.signal(signal.SIGINT, _on_sigint)  # Ctrl-C during an import ends the job quietly too
    route_sigint()  # past MindSpore's own SIGINT handler (runner/training/interrupts.py)

    with open(job_file, "rb") as f:
        job = pickle.load(f)
    task = job_task(*job["task"])  # the task as entry_point runs it, in the same error handler
    setup_globals()
    cfg = job["config"]
    # run_job reads only the callbacks from the context; the config is already composed.
    ret = run_job(
        hydra_context=HydraContext(config_loader=None, callbacks=job_callbacks(cfg)),
        task_function=task,
        config=cfg,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    error = None
    value = None
    exc = job_error(ret)
    if exc is not None:
        error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, KeyboardInterrupt):  # a signal in the job's set-up: the sweep names it, once
            traceback.print_exception(exc, file=sys.stderr)
    else:
        value = ret.return_value
        try:
            pickle.dumps(value)
        except Exception:
            value = repr(value)
    result = {
        "error": error,
        "return_value": value,
        "working_dir": ret.working_dir,
        "task_name": ret.task_name,
        "output_dir": ret.hydra_cfg.hydra.runtime.output_dir,
    }
    with open(job["result"], "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
