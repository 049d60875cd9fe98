"""Consumer of the `distributed` group: data parallel through MindSpore's own launcher, msrun.

`python -m runner distributed=dp distributed.workers=2` composes the config once, in this (parent)
process, writes it to the run directory as config.yaml (the run's record) and to rank_logs/config.yaml
(the same with `resume`, which the record leaves out), and runs

    msrun --worker_num=2 ... python -m runner --config-path <run_dir>/rank_logs --config-name config
          hydra.run.dir=<run_dir> hydra.output_subdir=null hydra/job_logging=stdout

so every rank trains from the very same resolved config. msrun marks its processes with MS_ROLE;
inside them run() calls init() below instead of launching again. Rank 0 writes the run's outputs
into the one run directory; every rank's console goes to <run_dir>/rank_logs/worker_<i>.log.
"""

import hashlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from typing import Optional

from runner.errors import ConfigError, UserError
from runner.report.metrics import RunMetrics
from runner.report.outputs import summary_line, warnings_recap, write_config
from runner.rundir.atomic import write_json
from runner.rundir.layout import RANK_LOGS, RunDir
from runner.rundir.lock import hand_to_ranks, in_msrun
from runner.training.interrupts import sigint_delivered

log = logging.getLogger("runner")
# MindSpore is imported in init(): this module is loaded with the recipe, before the CPU ISA cap is set.
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def should_launch(dist_cfg) -> bool:
    """Whether this process must start msrun (data parallel asked for, and not inside msrun already)."""
    return dist_cfg.mode == "dp" and not in_msrun()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(addr: str, port: int) -> None:
    """Raise ConfigError when msrun's scheduler could not listen on addr:port (msrun would wait for
    its ranks until distributed.timeout_s, then fail without naming the port)."""
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError as e:
            raise ConfigError(
                f"distributed.master_port={port} cannot be used on {addr} ({e.strerror}): another run or program "
                "holds it. Choose another port, or distributed.master_port=0 to pick a free one (single node)."
            ) from None


def msrun_command(cfg, run_dir: str, port: int) -> list:
    """The msrun command line that runs this config on every local rank."""
    d = cfg.distributed
    bin_dir = os.path.dirname(sys.executable)
    msrun = os.path.join(bin_dir, "msrun")
    if not os.path.exists(msrun):
        msrun = shutil.which("msrun") or "msrun"
    local = d.local_workers if d.local_workers is not None else d.workers
    return [
        msrun,
        f"--worker_num={d.workers}",
        f"--local_worker_num={local}",
        f"--master_addr={d.master_addr}",
        f"--master_port={port}",
        f"--node_rank={d.node_rank}",
        f"--log_dir={os.path.join(run_dir, RANK_LOGS)}",
        f"--cluster_time_out={d.timeout_s}",
        "--join=True",
        # msrun runs `python` from PATH (launch() puts this interpreter first) with these arguments.
        "python",
        "-m",
        "runner",
        "--config-path",
        os.path.join(run_dir, RANK_LOGS),  # launch() wrote the ranks' config.yaml there
        "--config-name",
        "config",
        f"hydra.run.dir='{run_dir}'",
        "hydra.output_subdir=null",  # the parent's .hydra/ is the record; ranks must not overwrite it
        "hydra/job_logging=stdout",  # msrun keeps each rank's console in its own log file
    ]


def launch(cfg, run_dir: str):
    """Run the (whole) config under msrun, wait, and return rank 0's RunMetrics (None on other nodes)."""
    d = cfg.distributed
    if d.workers < 2:
        raise ConfigError(f"distributed=dp needs distributed.workers >= 2, got {d.workers}.")
    local = d.local_workers if d.local_workers is not None else d.workers
    if local < d.workers and not d.master_port:
        raise ConfigError("Several nodes need the same fixed distributed.master_port on every node.")
    local_batch(cfg.batch_size, d.workers)  # fail here, not in every rank
    run_dir = os.path.abspath(run_dir)
    write_config(run_dir, cfg)  # the run's record (on a resume, it stays the one the run started with)
    # What every rank runs: this very config, resume included (the record holds no resume).
    write_config(RunDir(run_dir).rank_logs, cfg, record=False)
    if d.master_port and d.node_rank == 0:
        check_port_free(d.master_addr, d.master_port)
    port = d.master_port or free_port()
    cmd = msrun_command(cfg, run_dir, port)

    env = hand_to_ranks(run_dir, dict(os.environ))  # this process holds the run directory's lock for them
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH")) if p)
    log.info("data parallel: %d ranks (%d here) via msrun, port %d; rank logs in %s", d.workers, local, port, RANK_LOGS)
    stop, rank_warnings = threading.Event(), []
    follower = threading.Thread(
        target=follow_ranks, args=(RunDir(run_dir).rank_logs, stop), kwargs={"warnings": rank_warnings}, daemon=True
    )
    follower.start()
    try:
        with sigint_delivered():  # msrun and its ranks get Ctrl-C as they would without the runner
            proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    finally:
        stop.set()
        follower.join(timeout=10)
    with open(os.path.join(run_dir, RANK_LOGS, "msrun.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    metrics_path = RunDir(run_dir).metrics
    if proc.returncode != 0 or (d.node_rank == 0 and not os.path.exists(metrics_path)):
        tail = _tail(os.path.join(run_dir, RANK_LOGS, "worker_0.log")) or (proc.stdout + proc.stderr)[-2000:]
        raise UserError(
            f"The data-parallel run failed (msrun exit {proc.returncode}); each rank's log is in "
            f"{os.path.join(run_dir, RANK_LOGS)}. End of rank 0's log: {tail}"
        )
    if d.node_rank != 0:
        return None  # node 0 holds the outputs
    metrics = RunMetrics.read(metrics_path)
    print(summary_line(metrics) + warnings_recap(rank_warnings), flush=True)
    return metrics


def follow_ranks(log_dir: str, stop: threading.Event, poll_s: float = 0.5, warnings: Optional[list] = None) -> None:
    """While the ranks run, print rank 0's runner log records (its progress) and every other rank's
    runner warnings and errors from their rank_logs/worker_<i>.log, until stop is set (then once more).
    Every rank's runner warnings and errors are also appended to `warnings` (for the summary's recap)."""
    offsets: dict = {}
    while True:
        done = stop.is_set()
        names = sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []
        for name in names:
            found = re.fullmatch(r"worker_(\d+)\.log", name)
            if not found:
                continue
            rank = int(found.group(1))
            with open(os.path.join(log_dir, name), "rb") as f:
                f.seek(offsets.get(name, 0))
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next poll
            offsets[name] = offsets.get(name, 0) + len(complete)
            for line in complete.decode(errors="replace").splitlines():
                if "][runner][" not in line and not line.startswith("Error: "):
                    continue  # MindSpore's own lines stay in the rank's log
                warning = line.startswith("Error: ") or "][WARNING]" in line or "][ERROR]" in line
                if rank == 0:
                    print(line, flush=True)
                elif warning:
                    print(f"rank {rank}: {line}", flush=True)
                if warning and warnings is not None:
                    message = line.split("] - ", 1)[-1]
                    warnings.append(message if rank == 0 else f"rank {rank}: {message}")
        if done:
            return
        stop.wait(poll_s)


def _tail(path: str, n: int = 1500) -> str:
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()[-n:]


def init(dist_cfg):
    """Inside msrun: join the cluster and switch MindSpore to data parallel; return (rank, world size)."""
    if dist_cfg.mode != "dp":
        return 0, 1
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank
    from mindspore.communication import init as comm_init

    comm_init()  # the scheduler process (MS_ROLE=MS_SCHED) serves the cluster here and exits at its end
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return get_rank(), get_group_size()


def rank_threads(dist_cfg) -> Optional[int]:
    """CPU threads for each rank when several data-parallel ranks share this host (None: one process).

    The CPUs this process may use, shared evenly by the host's ranks: left alone, each rank's pools
    (MindSpore's and model.conv=onednn's) would start one thread per CPU and oversubscribe the host.
    """
    if dist_cfg.mode != "dp":
        return None
    local = dist_cfg.local_workers if dist_cfg.local_workers is not None else dist_cfg.workers
    if local <= 1:
        return None
    return max(1, len(os.sched_getaffinity(0)) // local)


def local_batch(batch_size: int, world: int) -> int:
    """batch_size is the global batch: each of `world` ranks takes an equal part of it."""
    if batch_size % world:
        raise ConfigError(
            f"batch_size={batch_size} is the global batch and must divide evenly over distributed.workers={world}."
        )
    return batch_size // world


def write_rank_record(run_dir: str, rank: int, net, final_loss: float) -> None:
    """Each rank's trainable-weight digest and last loss, so ranks can be checked for agreement."""
    h = hashlib.sha256()
    for p in net.trainable_params():
        h.update(p.name.encode())
        h.update(p.asnumpy().tobytes())
    path = os.path.join(run_dir, RANK_LOGS, f"rank_{rank}.json")
    write_json(path, {"rank": rank, "trainable_sha256": h.hexdigest(), "final_loss": final_loss})
