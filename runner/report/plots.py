"""PNG charts: a run's curves over its steps, a sweep's throughput and compile time per job, a confusion matrix."""

import matplotlib

matplotlib.use("Agg")  # files only; never a window, also without a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def run_plot(series: dict, path: str, title: str, val_curve=None) -> str:
    """Loss, validation (when it ran during training), loss scale (when the train cell has one) and step
    time against the step number."""
    panels = [("loss", "loss", False), ("loss_scale", "loss scale", True), ("step_time_ms", "step time (ms)", True)]
    panels = [p for p in panels if series.get(p[0]) is not None]
    if val_curve and len(val_curve) > 1:  # one point (validation only at the end) is no curve
        panels.insert(1, ("val", "val accuracy", False))
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.2 * len(panels)), sharex=True, squeeze=False)
    for ax, (key, label, log_y) in zip(axes[:, 0], panels):
        if key == "val":
            _val_panel(ax, val_curve)
            continue
        # A resume from a bare .ckpt knows the earlier losses of no step: the series align at their end.
        n = min(len(series["step"]), len(series[key]))
        ax.plot(series["step"][-n:], series[key][-n:], marker="." if n < 50 else None)
        ax.set_ylabel(label)
        if log_y and min(series[key]) > 0:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0, 0].set_title(title, fontsize=9)
    axes[-1, 0].set_xlabel("step (the first includes graph compilation)")
    return _save(fig, path)


def _val_panel(ax, curve):
    """Validation accuracy (left axis) and loss (right axis) at the steps where validation ran."""
    steps = [p["step"] for p in curve]
    ax.plot(steps, [p["accuracy"] for p in curve], marker="o", color="tab:green", label="val accuracy")
    ax.set_ylabel("val accuracy", color="tab:green")
    ax.grid(alpha=0.3)
    right = ax.twinx()
    right.plot(steps, [p["loss"] for p in curve], marker="s", color="tab:orange", label="val loss")
    right.set_ylabel("val loss", color="tab:orange")


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
