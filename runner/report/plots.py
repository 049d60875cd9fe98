"""PNG charts: a run's curves over its steps and epochs, a sweep's throughput and compile time per job, a
confusion matrix."""

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


def sweep_chart(rows: list, path: str, title: str) -> str:
    """Bars per job (runner/report/sweep.py's JobRow): throughput (speedup against the first job) and compile time."""
    labels = [f"#{r.job} {r.label}" for r in rows]
    thr = [r.value("throughput_samples_per_s") or 0.0 for r in rows]
    comp = [r.value("compile_seconds") or 0.0 for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 0.5 * len(rows) + 1.6), sharey=True)
    y = list(range(len(rows)))[::-1]
    a.barh(y, thr, color=["tab:red" if r.status != "ok" else "tab:blue" for r in rows])
    for yi, r, t in zip(y, rows, thr):
        text = r.status if r.status != "ok" else (f"x{r.speedup:.2f}" if r.speedup else "")
        a.text(t, yi, " " + text, va="center", fontsize=8)
    a.set_yticks(y, labels, fontsize=8)
    a.set_xlabel(f"throughput (samples/s); xN = speedup vs job #{rows[0].job}")
    b.barh(y, comp, color="tab:orange")
    b.set_xlabel("compile time (s)")
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)


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


def _save(fig, path: str) -> str:
    """Lay out, write and close a figure (every chart here is a file, never a window); its path."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
