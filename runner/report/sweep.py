"""Hydra callback that ends every multirun with summary.csv, summary.md and summary.png in the sweep directory.

The summary compares the jobs on what the sweep varies and what a user watches: validation accuracy and loss per
job and their curves over the epochs, and throughput and compile time where a setting that changes speed varies
(SPEED). A sweep over `seed` is also reported per remaining combination, as the mean and standard deviation over
its seeds (summary_seeds.csv and a table of its own in summary.md).
"""

import csv
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from hydra_plugins.runner_launcher.isolated_launcher import failed_fast, interruption, not_run
from runner.config.tree import flat

# report/plots.py (matplotlib, ~0.5 s) is imported only when the sweep has a chart to draw.
from runner.report import advice
from runner.report.metrics import RunMetrics
from runner.rundir.layout import CONFIG, FAILED, METRICS

log = logging.getLogger(__name__)

# Columns of the table, in order: (RunMetrics attribute, header, format).
COLUMNS = [
    ("val_accuracy", "val accuracy", "{:.4f}"),
    ("val_loss", "val loss", "{:.4f}"),
    ("compile_seconds", "compile s", "{:.2f}"),
    ("step_time_median_ms", "step ms (median)", "{:.1f}"),
    ("step_time_p90_ms", "step ms (p90)", "{:.1f}"),
    ("throughput_samples_per_s", "samples/s", "{:.1f}"),
    ("speedup", "speedup", "x{:.2f}"),
    ("peak_host_memory_mb", "host MB", "{:.0f}"),
    ("peak_device_memory_mb", "device MB", "{:.0f}"),
    ("compile_count", "compiles", "{}"),
    ("achieved_gflops_per_s", "GFLOP/s", "{:.1f}"),
]
# Settings that change how fast a job runs: a speedup column compares jobs that differ in one of them. A
# sweep over seeds or learning rates measures the same speed several times, and a column would show noise.
SPEED = (
    "mode",
    "amp",
    "sink",
    "batch_size",
    "padding",
    "model",
    "device",
    "distributed",
    "ladder",
    "data",
    "optim.accumulate_steps",
)
# Keys that name the job rather than change what it measures.
IGNORED = ("experiment_name", "ladder", "logger", "save_checkpoint", "defaults", "hydra")


@dataclass
class JobRow:
    """One job of a sweep: who it is, and its metrics when it finished."""

    job: object  # the job number (an int), or the directory name
    dir: str
    overrides: List[str]
    # ok | failed | interrupted (a signal stopped it) | validated (dry_run=true) | not run (the sweep stopped first)
    status: str = "ok"
    error: str = ""
    metrics: Optional[RunMetrics] = None
    config: dict = field(default_factory=dict)  # flattened, without the keys that only name the job
    label: str = ""  # the overrides that tell this job apart
    speedup: Optional[float] = None  # throughput against the first job
    # What this sweep did with the job (runner/rundir/sweep_jobs.py): "new" (ran), "kept" (finished earlier,
    # not run again), "resumed", "rerun" (failed earlier, ran again), "earlier" (a job of an earlier run of
    # the sweep that this command does not have), "" (not known: collect() without `since`).
    reused: str = ""

    @property
    def name(self) -> str:
        """#<number> for a job of this command, `dir <name>` for an earlier run's job (collect)."""
        return f"#{self.job}" if isinstance(self.job, int) else str(self.job)

    def value(self, key: str):
        """A table column: the speedup, achieved GFLOP/s, or a RunMetrics attribute (compile time only where a
        graph was compiled: PyNative's first step is no compile)."""
        if key == "speedup":
            return self.speedup
        if self.metrics is None:
            return None
        if key == "achieved_gflops_per_s":
            return (self.metrics.flops or {}).get("achieved_gflops_per_s")
        if key == "compile_seconds" and not self.compiled():
            return None
        return getattr(self.metrics, key)

    def compiled(self) -> bool:
        """Whether the job compiled a graph (graph or jit mode); PyNative runs the network op by op."""
        return self.metrics is not None and (self.metrics.mode != "pynative" or bool(self.metrics.compile_count))

    def steps_per_epoch(self) -> Optional[float]:
        """Training steps per epoch, from the validation record (step and epoch) or the steps over the epochs."""
        m = self.metrics
        if m is None:
            return None
        for point in reversed(m.val_curve or []):
            if point.get("epoch") and point.get("step"):
                return point["step"] / point["epoch"]
        epochs = self.config.get("epochs")
        return m.steps / epochs if m.steps and isinstance(epochs, int) and epochs > 0 else None


@dataclass
class SeedGroup:
    """The jobs of a sweep over `seed` that share every other override: their mean and standard deviation."""

    label: str  # the other overrides ("(every job)" when seed alone varies)
    rows: List[JobRow]
    stats: dict = field(default_factory=dict)  # metric -> (mean, standard deviation or None, finished jobs)

    @property
    def seeds(self) -> List[str]:
        return [o.partition("=")[2] for r in self.rows for o in r.overrides if o.partition("=")[0] == SEED]


SEED = "seed"
# What the seed table aggregates, in its order: (RunMetrics attribute, header, format).
SEED_COLUMNS = [
    ("val_accuracy", "val accuracy", "{:.4f}"),
    ("val_loss", "val loss", "{:.4f}"),
    ("val_top5_accuracy", "val top-5", "{:.4f}"),
    ("final_loss", "train loss (last step)", "{:.4f}"),
    ("throughput_samples_per_s", "samples/s", "{:.1f}"),
]


_failed = []


def failed_jobs() -> list:
    """Failed jobs of the sweep this process ran (the CLI exits 1 when there are any)."""
    return list(_failed)


class SweepSummary(Callback):
    """Collects each job's metrics.json or failed.json when the multirun ends."""

    started: Optional[float] = None

    def on_multirun_start(self, config, **kwargs) -> None:
        # A sweep run again into its directory continues it: the jobs of this run are those Hydra wrote
        # its record for from now on (runner/rundir/sweep_jobs.py).
        self.started = time.time()

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        rows = collect(sweep_dir, self.started, not_run())
        if not rows:
            return
        _failed.extend(r for r in rows if r.status == "failed" and r.reused != "earlier")
        notes = summarize(rows, sweep_dir, str(config.experiment_name))
        print(markdown(rows, notes), flush=True)
        also = ", ".join(n for n in ("summary.csv", SEEDS_CSV, "summary.png") if (sweep_dir / n).exists())
        print(f"Sweep summary: {sweep_dir / 'summary.md'} (and {also} there).", flush=True)
        stopped = failed_fast()
        if stopped is not None:
            skipped = [r.name for r in rows if r.status == NOT_RUN]
            print(
                f"Sweep stopped at the first failed job (#{stopped}; hydra.launcher.fail_fast=true): not run "
                f"{', '.join(skipped) or 'none'}. The same command continues the sweep in its directory "
                f"(hydra.sweep.dir={sweep_dir}): the failed job runs again, then the others.",
                flush=True,
            )

        stop = interruption()
        if stop["signal"]:
            done = [r.name for r in rows if r.status == "ok"]
            print(
                f"Sweep interrupted by {stop['signal']}: finished {', '.join(done) or 'none'}; interrupted "
                f"{', '.join(f'#{j}' for j in stop['jobs']) or 'none'}; {stop['not_started']} not started.",
                flush=True,
            )


NOT_RUN = "not run"
SEEDS_CSV = "summary_seeds.csv"


def collect(sweep_dir: Path, since: Optional[float] = None, skipped: Sequence[dict] = ()) -> list:
    """One JobRow per job directory, in job order, with the overrides that tell the jobs apart.

    since: when this run of the sweep started; each row then says what it did with the job (JobRow.reused),
    and a job of an earlier run that this one does not have is listed by its directory name. skipped: the jobs
    the launcher never started ({"num", "overrides", "why"}: a signal, or fail_fast), listed as not run."""
    from runner.rundir.sweep_jobs import recorded_plan

    rows = [
        JobRow(
            int(j["num"]),
            "",
            list(j["overrides"]),
            status=NOT_RUN,
            error="a signal stopped the sweep first"
            if j["why"] == "interrupted"
            else "an earlier job failed (hydra.launcher.fail_fast=true)",
        )
        for j in skipped
    ]
    for job_dir in sweep_dir.iterdir():
        if not job_dir.is_dir() or not ((job_dir / ".hydra").is_dir() or (job_dir / FAILED).exists()):
            continue
        row = _row(job_dir)
        if since is not None:
            record = recorded_plan(str(job_dir), since)
            if record is not None:
                row.reused = str(record.get("action", ""))
            elif _ran_since(job_dir, since):
                row.reused = "new"  # failed before the job could record its plan (a process that died)
            else:
                # Named by its directory, never by a number: this command's jobs hold the numbers.
                row.reused, row.job = "earlier", f"dir {job_dir.name}"
        rows.append(row)
    rows.sort(key=lambda r: (r.job if isinstance(r.job, int) else math.inf, r.dir))
    varying = _varying_overrides([r.overrides for r in rows])
    for r in rows:
        r.label = " ".join(o for o in r.overrides if o.split("=")[0] in varying) or "(same overrides)"
    if not speed_varies(rows):
        return rows  # no speed setting differs: no speedup column
    base = rows[0].value("throughput_samples_per_s")
    for r in rows:
        thr = r.value("throughput_samples_per_s")
        r.speedup = thr / base if base and thr else None
    return rows


def _ran_since(job_dir: Path, since: float) -> bool:
    try:
        return (job_dir / ".hydra" / "hydra.yaml").stat().st_mtime >= since
    except OSError:
        return False


def _row(job_dir: Path) -> JobRow:
    hydra_dir = job_dir / ".hydra"
    overrides, num = [], job_dir.name
    if (hydra_dir / "overrides.yaml").exists():
        overrides = [o for o in OmegaConf.load(hydra_dir / "overrides.yaml") if not o.startswith("hydra.")]
    if (hydra_dir / "hydra.yaml").exists():
        num = OmegaConf.load(hydra_dir / "hydra.yaml").hydra.job.num
    row = JobRow(int(num) if str(num).isdigit() else num, str(job_dir), list(overrides))
    metrics, failed = job_dir / METRICS, job_dir / FAILED
    if failed.exists():
        info = json.loads(failed.read_text())
        if info.get("error_type") == "Interrupted":
            row.status, row.error = "interrupted", info.get("error", "")
        else:
            row.status, row.error = "failed", f"{info.get('error_type', 'Error')}: {info.get('error', '')}"
        return row
    if not metrics.exists():
        saved = OmegaConf.load(hydra_dir / "config.yaml") if (hydra_dir / "config.yaml").exists() else {}
        if saved.get("dry_run") or saved.get("plan"):
            row.status = "validated"  # dry_run=true or plan=true: checked (and planned), nothing trained
            return row
        row.status, row.error = "failed", "no metrics.json (the job did not finish)"
        return row
    row.metrics = RunMetrics.read(str(metrics))
    if (job_dir / CONFIG).exists():
        body = OmegaConf.to_container(OmegaConf.load(job_dir / CONFIG))
        row.config = {k: v for k, v in flat(body).items() if k.split(".")[0] not in IGNORED}
    return row


def summarize(rows: list, sweep_dir: Path, title: str) -> list:
    """Write summary.csv, summary.md and summary.png; return the sweep's advice notes."""
    notes = advice.sweep_notes(rows)
    # Each job's own notes once, with the jobs they concern (most often all of them); none from failed jobs.
    jobs_of: dict = {}
    for r in rows:
        for n in r.metrics.advice if r.metrics and r.status == "ok" else []:
            jobs_of.setdefault(n, []).append(r.name)
    ok = sum(r.status == "ok" for r in rows)
    for n, jobs in jobs_of.items():
        notes.append(f"{'all jobs' if len(jobs) == ok > 1 else ', '.join(jobs)}: {n}")
    fields = ["job", "label", "status", "reused", *[c[0] for c in COLUMNS], "error", "overrides", "dir"]
    with open(sweep_dir / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            cells = {c[0]: r.value(c[0]) for c in COLUMNS}
            writer.writerow(
                {
                    "job": r.job,
                    "label": r.label,
                    "status": r.status,
                    "reused": r.reused,
                    **cells,
                    "error": r.error,
                    "overrides": " ".join(r.overrides),
                    "dir": r.dir,
                }
            )
    groups = seed_groups(rows)
    if groups:
        write_seed_csv(groups, sweep_dir / SEEDS_CSV)
    (sweep_dir / "summary.md").write_text(markdown(rows, notes) + "\n")
    from runner.report.plots import sweep_chart

    sweep_chart(rows, groups, speed_varies(rows), str(sweep_dir / "summary.png"), f"{title}: {sweep_dir}")
    return notes


def speed_varies(rows: list) -> bool:
    """Whether the jobs differ in a setting that changes speed (SPEED): then throughput and compile time compare."""
    varying = _varying_overrides([r.overrides for r in rows])
    return any(k.lstrip("+~").startswith(SPEED) for k in varying)


def seed_groups(rows: list) -> List[SeedGroup]:
    """The jobs grouped by every varying override but `seed`, each group's mean and standard deviation (sample,
    n-1) over its finished jobs; [] unless the sweep varies seed and some group holds more than one seed."""
    varying = _varying_overrides([r.overrides for r in rows])
    if SEED not in {k.lstrip("+") for k in varying}:
        return []
    groups: dict = {}
    for r in rows:
        rest = [o for o in r.overrides if o.split("=")[0] in varying and o.split("=")[0].lstrip("+") != SEED]
        groups.setdefault(" ".join(rest) or "(every job)", []).append(r)
    if all(len(members) < 2 for members in groups.values()):
        return []
    out = []
    for label, members in groups.items():
        group = SeedGroup(label, members)
        for key, _, _ in SEED_COLUMNS:
            values = [v for v in (r.value(key) for r in members if r.status == "ok") if _finite(v)]
            if values:
                mean = sum(values) / len(values)
                std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
                group.stats[key] = (mean, std, len(values))
        out.append(group)
    return out


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def write_seed_csv(groups: List[SeedGroup], path: Path) -> None:
    """summary_seeds.csv: one row per combination, <metric>_mean, <metric>_std and the finished jobs behind them."""
    fields = ["combination", "jobs", "seeds", "finished"]
    fields += [f"{key}_{part}" for key, _, _ in SEED_COLUMNS for part in ("mean", "std")]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for g in groups:
            row = {
                "combination": g.label,
                "jobs": " ".join(r.name for r in g.rows),
                "seeds": " ".join(g.seeds),
                "finished": sum(r.status == "ok" for r in g.rows),
            }
            for key, _, _ in SEED_COLUMNS:
                mean, std, _n = g.stats.get(key, (None, None, 0))
                row[f"{key}_mean"], row[f"{key}_std"] = mean, std
            writer.writerow(row)


def seed_markdown(groups: List[SeedGroup]) -> str:
    """The table over seeds: mean ± standard deviation per combination (one seed: its value alone)."""
    columns = [c for c in SEED_COLUMNS if any(c[0] in g.stats for g in groups)]
    head = ["combination", "seeds", "finished", *[c[1] for c in columns]]
    lines = [
        "Mean ± standard deviation over the seeds (sample standard deviation; summary_seeds.csv):",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for g in groups:
        cells = [g.label, ", ".join(g.seeds) or "-", f"{sum(r.status == 'ok' for r in g.rows)}/{len(g.rows)}"]
        for key, _, fmt in columns:
            mean, std, n = g.stats.get(key, (None, None, 0))
            if mean is None:
                cells.append("-")
            else:
                cells.append(fmt.format(mean) + (f" ± {fmt.format(std)}" if std is not None else " (one seed)"))
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def markdown(rows: list, notes: list) -> str:
    """The summary table (speedup against the first job, when a speed setting differs) and the advice notes."""
    columns = [c for c in COLUMNS if c[0] != "speedup" or any(r.speedup is not None for r in rows)]
    # The column appears once a sweep was run again into its directory: which jobs ran now and which not.
    continued = any(r.reused not in ("", "new") for r in rows)
    head = ["job", "overrides", "status", *(["this run"] if continued else []), *[c[1] for c in columns]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.name, r.label, f"{r.status}: {r.error}" if r.error else r.status]
        if continued:
            cells.append(REUSED.get(r.reused, r.reused or "-"))
        for key, _, fmt in columns:
            v = r.value(key)
            cells.append(fmt.format(v) if v is not None and r.status == "ok" else "-")
        # One table row per job: a multi-line error or a pipe would break the table.
        lines.append("| " + " | ".join(" ".join(c.split()).replace("|", "/") for c in cells) + " |")
    groups = seed_groups(rows)
    if groups:
        lines += ["", seed_markdown(groups)]
    if notes:
        lines += ["", "Notes from the measurements:", *[f"- {n}" for n in notes]]
    return "\n".join(lines)


REUSED = {
    "new": "ran",
    "kept": "kept (finished earlier)",
    "resumed": "resumed",
    "rerun": "ran again (failed earlier)",
    "earlier": "not in this command",
}


def _varying_overrides(lists: list) -> set:
    values = {}
    for overrides in lists:
        for o in overrides:
            key, _, value = o.partition("=")
            values.setdefault(key, set()).add(value)
    return {k for k, v in values.items() if len(v) > 1 or any(k not in {x.split("=")[0] for x in o} for o in lists)}
