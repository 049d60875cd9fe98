"""Shared helpers: run the real CLI in a subprocess and read what it left behind."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from runner.config.schema import register

register()

REPO = Path(__file__).resolve().parents[1]
# Tiny and fast: 8x8 inputs, a narrow resnet8, one epoch, no per-epoch noise in the logs.
TINY = ["epochs=1", "padding.height=8", "padding.width=8", "model.width=8", "log_every=1000"]


_USER_ISA = os.environ.get("ONEDNN_MAX_CPU_ISA")


def pytest_collection_finish(session):
    """Refuse a test module that sets ONEDNN_MAX_CPU_ISA when imported: collection imports every module in every
    xdist worker, so the cap reached every subprocess a test starts with the worker's environment (a killed run,
    a replay, a terminal), and on an AVX-512 CPU those children rounded differently from the runs they were
    compared with bit for bit. Set it for one command through run_cli's or run_in_process's env."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA") != _USER_ISA:
        raise pytest.UsageError(
            f"a test module set ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA')} when it was imported; "
            "pass it to the one command that needs it (run_cli(..., env=...))"
        )


@pytest.fixture(autouse=True)
def _isa_check_as_in_a_fresh_process():
    """Each test meets the runner's one-ISA-per-process check (runner/training/environment.py
    check_same_process) as a fresh process would. An xdist worker runs many in-process runs one after another;
    on an AVX-512 CPU the native path's AVX2 cap and the onednn path's no cap differ in effect, so whichever test
    ran first in a worker would have every later one refused, depending on how tests fell to workers. The
    kernels oneDNN loaded first stay in the process: their speed, not what the tests check."""
    environment = sys.modules.get("runner.training.environment")
    if environment is not None:
        environment._first_run.clear()
    yield


@pytest.fixture(autouse=True)
def _operator_caches_cleared():
    """Each test starts with the operator library's caches empty, as a fresh process does: what one test's
    shapes built is neither memory the next holds nor a primitive it reuses."""
    yield
    onednn = sys.modules.get("runner.models.onednn")
    if onednn is not None:
        onednn.clear_caches()


def has_compiler() -> bool:
    """Whether this machine has the C++ compiler the onednn operators are built with (their tests skip without)."""
    from runner.models.errors import ModelError
    from runner.models.onednn import find_compiler

    try:
        find_compiler()
        return True
    except ModelError:
        return False


def cpu_class() -> str:
    """The class of CPU a run's figures belong to: the widest vector ISA the kernels dispatch to, and the threads
    they split reductions over. Within a class a run is deterministic (tests/test_train.py pins a curve); across
    classes the kernels sum in another order, and the docs quote figures per class (tests/test_readme.py)."""
    from runner.models.onednn import cpu_flags

    flags = cpu_flags() or frozenset()
    if "avx512f" in flags:
        isa = "AVX-512 with AVX512_BF16" if "avx512_bf16" in flags else "AVX-512"
    else:
        isa = "AVX2" if "avx2" in flags else "no AVX2"
    return f"{isa}, {len(os.sched_getaffinity(0))} threads"


# The one reason every test of the compiled oneDNN operators skips with; the summary counts them and names the fix.
COMPILER_REASON = "needs a C++ compiler to build the oneDNN operators (install g++: apt-get install g++, or set CXX)"


def needs_compiler():
    """The skip mark of a test that builds or runs the compiled oneDNN operators."""
    return pytest.mark.skipif(not has_compiler(), reason=COMPILER_REASON)


def pytest_terminal_summary(terminalreporter):
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if COMPILER_REASON in str(r.longrepr)]
    if skipped:
        terminalreporter.write_line(
            f"{len(skipped)} test(s) of the compiled oneDNN operators skipped: this machine has no C++ compiler. "
            "Install g++ (Debian/Ubuntu: apt-get install g++) or set CXX to run them; `make test` says so too.",
            yellow=True,
        )


def run_cli(run_dir, *overrides, multirun=False, check=True, timeout=600, env=None):
    """`python -m runner` from the repository root, with its outputs under run_dir unless it is None."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    where = [f"{key}={run_dir}"] if run_dir is not None else []
    cmd = [sys.executable, "-m", "runner", *(["-m"] if multirun else []), *where, *overrides]
    # In-process tests set ONEDNN_MAX_CPU_ISA for themselves; a child must see only what the test passes.
    base = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


class CliResult:
    """What a command left: its exit status and everything it printed (the shape of subprocess.run's result)."""

    def __init__(self, args, returncode, stdout, stderr):
        self.args, self.returncode, self.stdout, self.stderr = args, returncode, stdout, stderr


@contextlib.contextmanager
def _captured_fds():
    """stdout and stderr of this process, file descriptors included (a sweep's job processes inherit
    them), written to two temporary files: yields a function that reads them back."""
    files = [tempfile.TemporaryFile(mode="w+b") for _ in range(2)]
    streams = (sys.stdout, sys.stderr)
    for s in streams:
        s.flush()
    saved = [os.dup(1), os.dup(2)]
    wrappers = []
    try:
        for fd, f in zip((1, 2), files):
            os.dup2(f.fileno(), fd)
        wrappers = [open(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace") for fd in (1, 2)]
        sys.stdout, sys.stderr = wrappers

        def read():
            for w in wrappers:
                w.flush()
            return [(f.seek(0), f.read().decode("utf-8", "replace"))[1] for f in files]

        yield read
    finally:
        for w in wrappers:
            w.flush()
            w.close()
        sys.stdout, sys.stderr = streams
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
        for f in files:
            f.close()


@contextlib.contextmanager
def _process_state_restored():
    """Undo what a command changes in the process it runs in: argv, environment, working directory,
    the SIGINT handler, logging (Hydra configures it for each run), Hydra's singletons, the flags
    the CLI keeps for one process (Ctrl-C seen, failed sweep jobs), the run directories it locked and
    MindSpore's execution mode."""
    import logging
    import signal

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    import runner.cli.app as app
    import runner.report.sweep as sweep
    import runner.rundir.lock as lock
    from hydra_plugins.runner_launcher import isolated_launcher

    argv, environ, cwd = list(sys.argv), dict(os.environ), os.getcwd()
    sigint, sigterm = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the CLI blocks SIGINT (runner/training/interrupts.py)
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    saved_logging = [(lg, list(lg.handlers), lg.level, lg.disabled, lg.propagate) for lg in loggers]
    raise_exceptions, disable = logging.raiseExceptions, logging.root.manager.disable
    interrupted = dict(isolated_launcher._interrupted)
    locks = dict(lock._held)
    mode = sys.modules["mindspore"].get_context("mode") if "mindspore" in sys.modules else None
    try:
        yield
    finally:
        sys.argv = argv
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        signal.signal(signal.SIGINT, sigint)
        signal.signal(signal.SIGTERM, sigterm)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for lg in [logging.getLogger()] + [
            lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
        ]:
            for h in lg.handlers:
                if not any(h in kept for _, kept, *_ in saved_logging):
                    h.close()
            lg.handlers = []
        for lg, handlers, level, disabled, propagate in saved_logging:
            lg.handlers, lg.level, lg.disabled, lg.propagate = handlers, level, disabled, propagate
        logging.raiseExceptions, logging.root.manager.disable = raise_exceptions, disable
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None
        app._interrupted = False
        sweep._failed.clear()
        isolated_launcher._interrupted.clear()
        isolated_launcher._interrupted.update(interrupted)
        for run_dir in set(lock._held) - set(locks):  # the kernel releases them when a process exits
            lock._held.pop(run_dir).close()
        from runner.rundir import sweep_jobs

        for sweep_dir in list(sweep_jobs._sweeps_held):  # a sweep's lock, held by its process until it exits
            sweep_jobs._sweeps_held.pop(sweep_dir).close()
        if "mindspore" in sys.modules:  # a run sets MindSpore's mode for the whole process (0: graph, its default)
            sys.modules["mindspore"].set_context(mode=0 if mode is None else mode)


def cli_in_process(*argv, env=None, cwd=REPO, app="runner.__main__:train"):
    """A console script's function (`runner-train` by default) called with argv in this process, as
    the command line would call it: preflight, Hydra, the task, its exit status and output. Much cheaper
    than run_cli for what stops before training (a dry run, a refused config). Like run_cli, the
    command sees ONEDNN_MAX_CPU_ISA only when env sets it."""
    import importlib

    module, name = app.split(":")
    entry = getattr(importlib.import_module(module), name)
    argv = [str(a) for a in argv]
    with _process_state_restored(), _captured_fds() as read:
        os.environ.pop("ONEDNN_MAX_CPU_ISA", None)
        os.environ.update(env or {})
        os.chdir(cwd)
        sys.argv = [module, *argv]
        try:
            entry()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # what the interpreter would print before exiting 1
            traceback.print_exc()
            code = 1
        out, err = read()
    return CliResult([module, *argv], code, out, err)


def run_in_process(run_dir, *overrides, multirun=False, check=True, env=None):
    """run_cli's twin through cli_in_process: `python -m runner` without a new interpreter."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    where = [f"{key}={run_dir}"] if run_dir is not None else []
    proc = cli_in_process(*(["-m"] if multirun else []), *where, *overrides, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(proc.args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def dry_run(run_dir, *overrides, multirun=False, env=None):
    """`python -m runner <overrides> dry_run=true` in this process (cli_in_process), outputs under run_dir."""
    return run_in_process(run_dir, *overrides, "dry_run=true", multirun=multirun, check=False, env=env)


def start_cli(run_dir, *overrides):
    """`python -m runner` started in the background (for signals and concurrency); stdout and stderr merged."""
    cmd = [sys.executable, "-m", "runner", f"hydra.run.dir={run_dir}", *overrides]
    base = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=base)


def wait_for(proc, condition, timeout=300, poll=0.05):
    """Poll condition() until true; fail with the process's output if it ends or the time runs out first."""
    import time

    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise AssertionError(f"condition not reached (exit {proc.poll()}):\n{proc.stdout.read()[-3000:]}")
        time.sleep(poll)


def run_module(module, *args, check=True, timeout=600, env=None):
    """`python -m <module> <args>` from the repository root: runner.evaluate, runner.predict, runner.export."""
    cmd = [sys.executable, "-m", module, *map(str, args)]
    base = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def module_in_process(module, *args, check=True):
    """run_module's twin through cli_in_process: runner.evaluate, runner.predict, runner.export without a new
    interpreter (their console scripts' function in runner/cli/commands.py)."""
    proc = cli_in_process(*args, app=f"runner.cli.commands:{module.rsplit('.', 1)[1]}")
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(proc.args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def outputs_of(proc) -> Path:
    """The output directory a lifecycle command names on its last line (`... | outputs: <dir>`)."""
    line = proc.stdout.strip().splitlines()[-1]
    assert "outputs: " in line, proc.stdout
    return Path(line.rsplit("outputs: ", 1)[1])


def metrics(run_dir) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


@pytest.fixture
def tiny():
    return list(TINY)


def built_once(tmp_path_factory, name, build) -> Path:
    """A directory that build(directory) fills once per test session. Under pytest-xdist every worker
    process has session fixtures of its own: the first to get here builds, the others wait for it and
    reuse the result, so a shared run is trained once, not once per worker."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        where = tmp_path_factory.mktemp(name)
        build(where)
        return where
    import fcntl

    root = tmp_path_factory.getbasetemp().parent  # this session's, shared by its workers
    where, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
            build(where)
            done.touch()
    return where


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One run of the default configuration at TINY size, shared by the tests that only read it."""
    return built_once(tmp_path_factory, "tiny_run", lambda run_dir: run_cli(run_dir, *TINY))


# The second shared run: no validation, no checkpoint, a log line every 20 steps, and the user's own
# ONEDNN_MAX_CPU_ISA (a subprocess: oneDNN reads it once, when MindSpore loads).
EVAL_OFF = ["eval=false", "save_checkpoint=false", "log_every=20"]
EVAL_OFF_ISA = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}


@pytest.fixture(scope="session")
def eval_off_run(tmp_path_factory):
    """One TINY run with EVAL_OFF under EVAL_OFF_ISA, shared by the tests that only read it."""
    return built_once(tmp_path_factory, "eval_off_run", lambda d: run_cli(d, *TINY, *EVAL_OFF, env=EVAL_OFF_ISA))


def compose_cfg(*overrides):
    """The composed, typed config `python -m runner <overrides>` would run (no validation)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def build(*overrides):
    """datasets.build_data on the composed config, as the runner calls it."""
    from runner.datasets import build_data

    cfg = compose_cfg(*overrides)
    return build_data(cfg.data, cfg.padding, cfg.batch_size, cfg.seed)


def batches(dataset):
    return list(dataset.create_tuple_iterator(output_numpy=True))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: `-p no:xdist` (and the compat venvs) run without it
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: the CPUs this process may use (psutil's count, xdist's default, sees the host's cores
    inside a container), at most 8: each worker holds a MindSpore of its own (~0.7 GB)."""
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8))


def pytest_collection_modifyitems(config, items):
    """cpu_only tests assert what MindSpore does on a CPU; elsewhere they are skipped."""
    if os.environ.get("RUNNER_TEST_DEVICE", "cpu") == "cpu":
        return
    skip = pytest.mark.skip(reason="asserts CPU-specific behaviour (RUNNER_TEST_DEVICE is not cpu)")
    for item in items:
        if "cpu_only" in item.keywords:
            item.add_marker(skip)


# Class folders named by words, so their sorted order (eight, five, four, ...) differs from the digits':
# a label shown as its index instead of its name, or mapped through the wrong order, fails the tests.
DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
# Sizes on disk for the lifecycle tests: several shapes and aspect ratios in one folder.
MIXED_SIZES = [(8, 8), (12, 10), (16, 24), (6, 9)]


def word_digit_folder(root, sizes=MIXED_SIZES, per_class=12, val_per_class=4, seed=0):
    """imagegen.digit_folder with the class folders renamed to DIGIT_WORDS; returns root."""
    from imagegen import digit_folder

    digit_folder(root, sizes, per_class=per_class, val_per_class=val_per_class, seed=seed)
    for split in ("train", "val"):
        for i, word in enumerate(DIGIT_WORDS):
            (Path(root) / split / str(i)).rename(Path(root) / split / word)
    return Path(root)


def folder_run_args(root, padding=("padding.height=8", "padding.width=8")):
    """A tiny grayscale run on an image folder (mixed sizes, RGB/RGBA/L files)."""
    return [
        "epochs=2",
        *padding,
        "model.width=8",
        "log_every=1000",
        "batch_size=16",
        "data=imagefolder",
        f"data.root={root}",
        "data.channels=1",
        "data.mean=[0.5]",
        "data.std=[0.5]",
    ]


@pytest.fixture(scope="session")
def folder_run(tmp_path_factory):
    """(run directory, data root): one trained tiny run shared by the lifecycle tests."""

    def build(base):
        run_cli(base / "run", *folder_run_args(word_digit_folder(base / "digits")))

    base = built_once(tmp_path_factory, "lifecycle", build)
    return base / "run", base / "digits"


@pytest.fixture(scope="session")
def folder_run_evaluated(folder_run):
    """(run directory, data root, evaluate's metrics.json) for the shared run, evaluated once."""
    run, root = folder_run
    out = outputs_of(module_in_process("runner.evaluate", f"run={run}"))
    return run, root, json.loads((out / "metrics.json").read_text())
