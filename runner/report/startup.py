"""Seconds from the command to the first training step, by phase: metrics.json's `startup`.

The phases: `import` (the process starts -> the command's function runs), `compose` (-> Hydra hands the
composed, checked config to the task), `build` (-> Model.train begins: MindSpore's import, the data, the
network, the trainer), `first_step` (-> the first step ends: the pipeline's start, graph compilation and
the step itself). A phase this process did not go through is None: a run through `runner.train()` has no
command (import, compose), a sweep job started by its launcher no command of its own.
"""

import os
import sys
import time
from typing import Callable, Dict, Optional

_marks: Dict[str, float] = {}
_commands = 0  # commands started in this process: only the first one's import phase is its own


def process_age() -> Optional[float]:
    """Seconds since this process started (Linux: /proc/self/stat against the boot clock), else None."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        start_ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime, in clock ticks
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return None


def command_started(command: Callable) -> None:
    """The command's function runs (runner/cli/app.py): the end of the import phase, the start of compose."""
    global _commands
    _marks.clear()
    now = time.perf_counter()
    _marks["entry"] = now
    _commands += 1
    age = process_age()
    if _commands == 1 and age is not None and _started_for(command):
        _marks["process_start"] = now - age


def _started_for(command: Callable) -> bool:
    """Whether this process was started to run command: its __main__ (`python -m runner`, or the console
    script pip wrote) holds the command's function. A test session or a notebook that calls the function
    started long before it, for other things: its age is not the command's import time."""
    main = sys.modules.get("__main__")
    return main is not None and any(v is command for v in vars(main).values())


def command_ended() -> None:
    """The command's function returns: a runner.train() call after it measures from its own call."""
    _marks.clear()


def task_started() -> None:
    """runner.train is called (by the command's task, or directly): the start of build."""
    if "entry" not in _marks:  # not inside a command: a direct call, measured from here
        _marks.clear()
    _marks["task"] = time.perf_counter()


def record(train_begin: Optional[float], first_step_end: Optional[float]) -> dict:
    """metrics.json's `startup` (perf_counter times of Model.train's begin and of its first step's end),
    then forgets the marks: a later run in this process measures its own."""
    m = dict(_marks)
    _marks.clear()

    def span(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return round(b - a, 3) if a is not None and b is not None else None

    phases = {
        "import": span(m.get("process_start"), m.get("entry")),
        "compose": span(m.get("entry"), m.get("task")),
        "build": span(m.get("task"), train_begin),
        "first_step": span(train_begin, first_step_end),
    }
    start = m.get("process_start", m.get("entry", m.get("task")))
    return {**phases, "total": span(start, first_step_end), "from": _origin(m)}


def _origin(m: dict) -> Optional[str]:
    if "process_start" in m:
        return "process start"
    if "entry" in m:
        return "command (this process ran another before it, or started long before it)"
    return "runner.train() call" if "task" in m else None
