"""PNG charts: a run's curves over its steps and epochs, a sweep's jobs compared (summary.png), a confusion
matrix."""

import math

import matplotlib

matplotlib.use("Agg")  # files only; never a window, also without a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def run_plot(
    series: dict, path: str, title: str, val_curve=None, steps_per_epoch: int = 0, compiles: bool = True
) -> str:
    """The run's curves against the step (and the epoch, on the top axis): training and validation loss on one
    axis, validation accuracy, the learning rate, the loss scale (when the train cell has one) and the step time.

    compiles: the first step compiled the graph (graph and jit mode), which the axis label says."""
    val_curve = list(val_curve or [])
    shown = {
        "loss": True,
        "accuracy": bool(val_curve),
        "lr": any(math.isfinite(v) for v in series.get("lr") or []),
        "loss_scale": series.get("loss_scale") is not None,
        "step_time_ms": series.get("step_time_ms") is not None,
    }
    labels = {
        "loss": "loss",
        "accuracy": "val accuracy",
        "lr": "learning rate",
        "loss_scale": "loss scale",
        "step_time_ms": "step time (ms)",
    }
    panels = [key for key, show in shown.items() if show]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 1.2 + 1.9 * len(panels)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], panels):
        if key == "loss":
            _loss_panel(ax, series, val_curve)
        elif key == "accuracy":
            ax.plot([p["step"] for p in val_curve], [p["accuracy"] for p in val_curve], marker="o", color="tab:green")
        else:
            steps, values = _aligned(series, key)
            ax.plot(steps, values, marker="." if len(values) < 50 else None)
            if key != "lr" and _positive(values):
                ax.set_yscale("log")
        ax.set_ylabel(labels[key])
        ax.grid(alpha=0.3)
    top = axes[0, 0]
    if steps_per_epoch > 0:  # the epoch, read off the same x: a second scale, not a second curve

        def epoch(step):
            return step / steps_per_epoch

        def step(epoch):
            return epoch * steps_per_epoch

        top.secondary_xaxis("top", functions=(epoch, step)).set_xlabel("epoch", fontsize=8)
    fig.suptitle(title, fontsize=9)
    axes[-1, 0].set_xlabel("step (the first includes graph compilation)" if compiles else "step")
    return _save(fig, path)


def _aligned(series: dict, key: str):
    """(steps, values) of a per-step-call series; a resume from a bare .ckpt knows the earlier values of no
    step, so the series align at their end."""
    n = min(len(series["step"]), len(series[key]))
    return series["step"][-n:], series[key][-n:]


def _positive(values) -> bool:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return bool(finite) and min(finite) > 0


def _loss_panel(ax, series: dict, val_curve: list) -> None:
    """Training loss per step and validation loss per validation, on one axis; logarithmic once the losses
    span two decades (a converging run's late steps are invisible on a linear axis)."""
    steps, losses = _aligned(series, "loss")
    ax.plot(steps, losses, marker="." if len(losses) < 50 else None, lw=0.8, color="tab:blue", label="train loss")
    values = [v for v in losses if math.isfinite(v)]
    if val_curve:
        val = [p["loss"] for p in val_curve]
        ax.plot([p["step"] for p in val_curve], val, marker="o", color="tab:orange", label="val loss")
        values += [v for v in val if math.isfinite(v)]
    if _positive(values) and max(values) / min(values) >= 100:
        ax.set_yscale("log")
    ax.legend(fontsize=8, loc="upper right")


def sweep_chart(rows: list, groups: list, speed: bool, path: str, title: str) -> str:
    """summary.png: sweep_figure written to path."""
    return _save(sweep_figure(rows, groups, speed, title), path, tight=False)


def sweep_figure(rows: list, groups: list, speed: bool, title: str):
    """A sweep's jobs side by side (runner/report/sweep.py's JobRow and SeedGroup): validation accuracy and loss
    per job (per combination with the spread over its seeds), every job's loss and accuracy over the epochs, and,
    where a speed setting varies (speed), throughput and compile time. One colour per job (per combination when
    seeds are aggregated), the same in every panel, so the bars' labels name the curves."""
    import textwrap

    entries = _sweep_entries(rows, groups)
    colours = plt.get_cmap("tab10" if len(entries) <= 10 else "tab20")
    colour = {id(r): colours(i % colours.N) for i, (_, members) in enumerate(entries) for r in members}
    labels = [textwrap.fill(label, 38) for label, _ in entries]
    bar_h = 0.42 * sum(max(1, lb.count("\n") + 1) for lb in labels) + 1.1
    heights = [bar_h, 3.4] + ([bar_h] if speed else [])
    fig = plt.figure(figsize=(12, sum(heights) + 0.8), layout="constrained")
    grid = fig.add_gridspec(len(heights), 2, height_ratios=heights)
    y = np.arange(len(entries))[::-1]

    acc, loss = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    _value_panel(acc, entries, y, colour, "val_accuracy", "val accuracy", "{:.4f}")
    _value_panel(loss, entries, y, colour, "val_loss", "val loss", "{:.4f}")
    acc.set_yticks(y, labels, fontsize=8)
    loss.set_yticks(y, [""] * len(y))

    curves, val = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    val.sharex(curves)
    _curves(curves, val, rows, colour)

    if speed:
        thr, comp = fig.add_subplot(grid[2, 0]), fig.add_subplot(grid[2, 1])
        base = rows[0].name
        _value_panel(thr, entries, y, colour, "throughput_samples_per_s", f"throughput (samples/s; xN: speedup vs "
                     f"{base})", "{:.0f}", bars=True)  # fmt: skip
        _value_panel(comp, entries, y, colour, "compile_seconds", "graph compile (s)", "{:.2f} s", bars=True)
        thr.set_yticks(y, labels, fontsize=8)
        comp.set_yticks(y, [""] * len(y))
    fig.suptitle(textwrap.fill(title, 130), fontsize=9)
    return fig


def _sweep_entries(rows: list, groups: list) -> list:
    """[(label, jobs)] of the bars: a combination and its seeds, or one job each."""
    if groups:
        return [(f"{g.label} ({_seeds_said(g.rows)})", g.rows) for g in groups]
    return [(f"{r.name} {r.label}", [r]) for r in rows]


def _seeds_said(rows: list) -> str:
    """`3 seeds`, or `3 seeds, 1 failed` where some did not finish."""
    said = f"{len(rows)} seed{'s' if len(rows) != 1 else ''}"
    others = [r.status for r in rows if r.status != "ok"]
    for status in sorted(set(others)):
        said += f", {others.count(status)} {status}"
    return said


def _value_panel(ax, entries, y, colour, key, label, fmt, bars=False):
    """One mark per entry: the job's value, or the mean of a combination's seeds with their standard deviation as
    an error bar and each seed as a black dot; a job without the value is named by its status instead. bars:
    bars from zero (throughput, compile time); else points on an axis fitted to the values, so that accuracies
    of 0.97 and 0.99 look apart."""
    shown = []
    for yi, (_, members) in zip(y, entries):
        values = [r.value(key) for r in members if r.status == "ok"]
        values = [v for v in values if isinstance(v, (int, float)) and np.isfinite(v)]
        if not values:
            shown.append((yi, members, None, 0.0, [], _missing(members, key, bars)))
            continue
        mean = float(np.mean(values))
        std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        text = fmt.format(mean) + (f" ± {fmt.format(std)}" if len(values) > 1 else "")
        speedup = members[0].speedup if key == "throughput_samples_per_s" and len(members) == 1 else None
        shown.append((yi, members, mean, std, values, text + (f" (x{speedup:.2f})" if speedup else "")))
    marks = [v for *_, mean, std, values, _ in shown if mean is not None for v in (mean - std, mean + std, *values)]
    low, high = (0.0, max(marks, default=1.0)) if bars else (min(marks, default=0.0), max(marks, default=1.0))
    span = (high - low) or max(abs(high) * 0.05, 1e-3)
    left = 0.0 if bars else low - 0.15 * span
    for yi, members, mean, std, values, text in shown:
        if mean is None:
            colour_of = "tab:red" if "failed" in text else "dimgray"
            ax.text(left, yi, f" {text}", va="center", fontsize=8, color=colour_of)
            continue
        c = colour[id(members[0])]
        if bars:
            ax.barh(yi, mean, color=c, alpha=0.85, xerr=std or None, capsize=3)
        else:
            ax.errorbar(mean, yi, xerr=std or None, fmt="o", color=c, markersize=7, capsize=4)
        if len(values) > 1:
            ax.scatter(values, [yi] * len(values), color="black", s=10, zorder=3)
        ax.text(mean + std, yi, f"  {text}", va="center", fontsize=8)
    # Room on the right for the value written beside the furthest mark.
    ax.set_xlim(left, high + (0.45 if bars else 0.7) * span)
    ax.set_ylim(min(y) - 0.6, max(y) + 0.6)
    ax.set_title(label, fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def _missing(members, key, compile_panel) -> str:
    """Why an entry has no bar: its jobs' status, no validation, or no graph compile."""
    statuses = sorted({r.status for r in members})
    if statuses != ["ok"]:
        return ", ".join(statuses)
    if compile_panel and not any(r.compiled() for r in members):
        return "no graph compile (pynative)"
    if compile_panel:
        return "too few steps to time the compile"
    return "not measured (eval=false?)" if key.startswith("val") else "not measured"


def _curves(loss_ax, val_ax, rows, colour):
    """Training loss (thin: per step; solid: the epoch's mean) with validation loss (dashed) on one axis, and
    validation accuracy on another, against the epoch; steps where the epoch length is unknown."""
    spans, in_epochs = [], all(r.steps_per_epoch() for r in rows if r.metrics is not None)
    for r in rows:
        m = r.metrics
        if m is None or r.status != "ok":
            continue
        c, per = colour[id(r)], r.steps_per_epoch() if in_epochs else None
        losses = np.asarray(m.loss_curve or [], dtype=float)
        if len(losses):
            steps = np.arange(len(losses)) + (m.steps - len(losses) + 1)
            x = steps / per if per else steps
            loss_ax.plot(x, losses, color=c, alpha=0.25, linewidth=0.8)
            if per and per >= 2:
                epochs = np.ceil(steps / per - 1e-9)
                ends = sorted(set(epochs))
                loss_ax.plot(ends, [losses[epochs == e].mean() for e in ends], color=c, marker="o", markersize=3)
            spans += [v for v in losses if np.isfinite(v) and v > 0]
        points = [p for p in m.val_curve or [] if p.get("loss") is not None]
        if points:
            x = [p["epoch"] if per else p["step"] for p in points]
            loss_ax.plot(x, [p["loss"] for p in points], color=c, linestyle="--", marker="s", markersize=3)
            val_ax.plot(x, [p["accuracy"] for p in points], color=c, marker="o", markersize=3)
            spans += [p["loss"] for p in points if p["loss"] > 0]
        elif m.val_accuracy is not None and per:  # validation only at the end: one point
            val_ax.plot([m.steps / per], [m.val_accuracy], color=c, marker="o")
            if m.val_loss is not None:
                loss_ax.plot([m.steps / per], [m.val_loss], color=c, marker="s", linestyle="none")
    if spans and max(spans) / min(spans) > 30:  # the loss spans decades: log scale keeps the late epochs legible
        loss_ax.set_yscale("log")
    unit = "epoch" if in_epochs else "step"
    loss_ax.set_title("loss: training (thin: per step, dots: epoch mean), validation (dashed)", fontsize=9)
    val_ax.set_title("val accuracy", fontsize=9)
    for ax in (loss_ax, val_ax):
        ax.set_xlabel(unit)
        ax.grid(alpha=0.3)


def confusion_plot(confusion: dict, path: str, title: str) -> str:
    """The confusion matrix as a heat map, counts written in the cells while they stay legible."""
    m = np.asarray(confusion["matrix"])
    names = confusion["labels"]
    k = len(names)
    size = min(12, 2.5 + 0.45 * k)
    fig, ax = plt.subplots(figsize=(size, size))
    share = m / np.maximum(m.sum(axis=1, keepdims=True), 1)
    ax.imshow(share, cmap="Blues", vmin=0, vmax=1)  # colour: share of the true class
    if k <= 25:
        for i in range(k):
            for j in range(k):
                if m[i, j]:
                    colour = "white" if share[i, j] > 0.5 else "black"
                    ax.text(j, i, str(m[i, j]), ha="center", va="center", fontsize=8, color=colour)
        ax.set_xticks(range(k), names, rotation=90 if max(map(len, names)) > 3 else 0, fontsize=8)
        ax.set_yticks(range(k), names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def _save(fig, path: str, tight: bool = True) -> str:
    """Lay out, write and close a figure (every chart here is a file, never a window); its path. tight=False: the
    figure lays itself out (layout="constrained")."""
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
