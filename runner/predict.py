"""`python -m runner.predict run=<run dir> input=<image file or folder> topk=5`.

Classifies image files with a run's network, preprocessed exactly as the run's data (the same
datasets/ ops: channels, padding, normalization), and writes `<run>/predict-<time>/predictions.csv`.
"""

import csv
import logging
import os
from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING
from PIL import Image
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from runner import saved_model
from runner.errors import ConfigError, InputError
from runner.rundir import saved_run
from runner.rundir.atomic import write_json
from runner.rundir.saved_run import DataOverrides

log = logging.getLogger("runner")
# Lazy imports: runner.datasets and mindspore.dataset load MindSpore, which must wait until the CPU ISA
# cap is set (saved_model.before_mindspore).


@dataclass
class PredictConfig:
    run: str = MISSING  # the training run's directory (holds config.yaml)
    input: str = MISSING  # an image file, or a folder searched recursively for images
    topk: int = 5  # labels and probabilities per image (at most the number of classes)
    ckpt: str = "final"  # final (model.ckpt) | last | best | a .ckpt path
    batch_size: Optional[int] = None  # None: the run's batch_size
    use_amp: bool = True  # at the run's AMP level, as evaluate; false: FP32 throughout (not `amp`: a config group)
    show: int = 10  # rows of the table printed at the end (all rows are in predictions.csv)
    data: DataOverrides = field(default_factory=DataOverrides)  # e.g. data.root=... if the training data moved


ConfigStore.instance().store(name="predict_schema", node=PredictConfig)


def shown(path: str) -> str:
    """A path as text that can be written anywhere: bytes of a file name that are not UTF-8 (Python keeps
    them as surrogates, which no UTF-8 file takes) become \\xNN escapes, as a shell shows them."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _not_regular(path: str) -> Optional[str]:
    """Why path cannot be read as an image file (a FIFO would block the reader forever), or None: the
    data readers' own rule (runner.datasets.errors.not_regular)."""
    from runner.datasets.errors import not_regular

    return not_regular(path)


def find_images(path: str) -> Tuple[list, list]:
    """(image files `input=` names, [(path, reason)] of names that are no readable file): the file itself,
    or every file with an image extension below a folder, sorted. Only regular files are kept."""
    from runner.datasets.sources import IMAGE_EXTENSIONS

    if not os.path.isdir(path):
        if not os.path.lexists(path):
            raise InputError(f"input={shown(path)}: no such file or folder.")
        why = _not_regular(path)
        if why:
            raise InputError(f"input={shown(path)}: {why}; name an image file or a folder of them.")
        return [path], []
    found, odd = [], []
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if os.path.splitext(name)[1] in IMAGE_EXTENSIONS:
                full = os.path.join(folder, name)
                why = _not_regular(full)
                (odd.append((full, why)) if why else found.append(full))
    if not found:
        raise InputError(
            f"input={shown(path)} holds no image files ({', '.join(IMAGE_EXTENSIONS[::2])}), also in subfolders"
            + (f"; not regular files: {', '.join(shown(p) for p, _ in odd[:3])}." if odd else ".")
        )
    return found, odd


# What MindSpore's Decode reads (PIL's format names; MPO is a camera JPEG). Other data under an image
# extension (a GIF named .png) fails inside the pipeline, and Decode dumps it into the working directory.
DECODABLE = ("JPEG", "MPO", "PNG", "BMP", "TIFF")


def probe(paths: list, advance=lambda: None):
    """(readable paths, their (height, width), [(unreadable path, reason)]): each file fully decoded by PIL,
    since a header alone misses truncated files (the check data=imagefolder makes), then by MindSpore's own
    Decode, which the pipeline uses and which refuses some files PIL reads (a float32 TIFF): a file that
    fails there would end the whole pipeline, so it is skipped here."""
    from mindspore.dataset.vision import Decode

    decode = Decode()
    good, sizes, bad = [], [], []
    for p in paths:
        advance()
        try:
            with Image.open(p) as im:
                im.load()
                if im.format not in DECODABLE:
                    bad.append((p, f"{im.format} data, which MindSpore's Decode does not read"))
                    continue
                kind = f"{im.format} {im.mode}"
            image = decode(np.fromfile(p, dtype=np.uint8))
            sizes.append(tuple(image.shape[:2]))
            good.append(p)
        except Image.DecompressionBombError as e:  # over PIL's pixel limit: PIL refuses to decode it
            bad.append((p, str(e).splitlines()[0]))
        except RuntimeError:  # MindSpore's Decode (its message is a multi-line pipeline report)
            bad.append((p, f"MindSpore's Decode cannot read this {kind} image"))
        except (OSError, SyntaxError, ValueError) as e:  # PIL's errors for corrupt, truncated or unknown data
            bad.append((p, str(e).splitlines()[0] if str(e) else type(e).__name__))
    return good, sizes, bad


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def predict(app, out_dir: str) -> dict:
    """Classify app.input with a checkpoint of app.run; write predictions.csv into out_dir; return a summary."""
    _check_settings(app)
    cfg = saved_run.load_config(app.run, app.data)
    saved_model.before_mindspore(cfg)  # the image extensions come from runner.datasets.sources, which loads MindSpore
    batch_size = app.batch_size or cfg.batch_size
    console = Console(stderr=True)
    good, sizes, bad = _readable_images(app, batch_size, console)  # before anything heavy: a wrong input= fails now
    saved = saved_model.open_run(app.run, app.ckpt, cfg, batch_size)
    net, level = saved_model.inference_net(saved.net, cfg, app.use_amp, saved.target, out_dir)
    names = _class_names(app, cfg, saved.data)
    k = min(app.topk, len(names))
    with _bars(console, len(good), batch_size) as bar:
        top_idx, top_p = _top_k(net, cfg, good, sizes, batch_size, k, bar)
    csv_path = _write_csv(os.path.join(out_dir, "predictions.csv"), good, names, top_idx, top_p)
    summary = {
        "predictions": csv_path,
        "images": len(good),
        "skipped": [{"path": shown(p), "reason": r} for p, r in bad],
        "topk": k,
        "checkpoint": saved.checkpoint["path"],
        "run": os.path.abspath(app.run),
        "amp_level_used": level,
        "device_target": saved.target,
        "padding": str(cfg.padding.name),
    }
    write_json(os.path.join(out_dir, "predict.json"), summary)
    _print_table(console, app, good, names, top_idx, top_p)
    skipped = f", {len(bad)} unreadable skipped" if bad else ""
    print(f"{len(good)} images classified{skipped} | top-{k} in predictions.csv | outputs: {out_dir}", flush=True)
    return summary


def _check_settings(app) -> None:
    if app.topk < 1:
        raise ConfigError(f"topk must be at least 1, got {app.topk}.")
    if app.batch_size is not None and app.batch_size < 1:
        raise ConfigError(f"batch_size must be positive, got {app.batch_size}.")


def _bars(console, files: int, batch_size: int) -> Progress:
    """On a terminal, for more than two batches' worth of files: a progress bar (reading, then predicting)."""
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    quiet = files <= 2 * batch_size or not console.is_terminal
    return Progress(*columns, console=console, transient=True, disable=quiet)


def _readable_images(app, batch_size: int, console):
    """(readable image paths, their sizes, (path, reason) of those skipped); InputError when none is readable."""
    paths, odd = find_images(app.input)
    with _bars(console, len(paths), batch_size) as bar:
        task = bar.add_task("check ", total=len(paths))
        good, sizes, bad = probe(paths, lambda: bar.advance(task))
    bad = sorted(odd + bad)
    for p, reason in bad:
        log.warning("skipped %s: not a readable image (%s)", shown(p), reason)
    if not good:
        names = ", ".join(f"{shown(p)} ({r})" for p, r in bad[:3])
        raise InputError(f"No readable image in input={shown(app.input)}: {names}{' ...' if len(bad) > 3 else ''}.")
    return good, sizes, bad


def _class_names(app, cfg, data) -> list:
    """The labels of the network's outputs: the run's recorded classes (classes.json) before the data's own."""
    recorded = saved_run.recorded_classes(app.run)
    names = saved_run.class_names(data, saved_run.num_outputs(cfg, data, app.run), recorded)
    current = [str(n) for n in (getattr(data, "class_names", None) or [])]
    if recorded and current and current != recorded:
        log.warning(
            "the run's training data now names its classes %s, the run trained on %s (classes.json): the labels "
            "are the run's, which its network's outputs stand for",
            current[:6],
            recorded[:6],
        )
    return names


def _top_k(net, cfg, good, sizes, batch_size: int, k: int, bar):
    """(class indices, probabilities) of each image's k most probable classes, in the order of good."""
    from runner.datasets import build_inputs

    inputs = build_inputs(cfg.data, cfg.padding, good, sizes, batch_size)
    top_idx = np.zeros((len(good), k), dtype=np.int64)
    top_p = np.zeros((len(good), k), dtype=np.float64)
    task = bar.add_task("predict", total=len(good))
    for images, index in inputs.create_tuple_iterator(num_epochs=1):
        probs = softmax(net(images).asnumpy().astype(np.float64))
        order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        i = index.asnumpy()
        top_idx[i] = order
        top_p[i] = np.take_along_axis(probs, order, axis=1)
        bar.advance(task, len(i))
    return top_idx, top_p


def _write_csv(csv_path: str, good, names, top_idx, top_p) -> str:
    k = top_idx.shape[1]
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["path"] + [c for j in range(1, k + 1) for c in (f"label_{j}", f"prob_{j}")])
        for p, idx, pr in zip(good, top_idx, top_p):
            w.writerow([shown(p)] + [c for j in range(k) for c in (names[idx[j]], f"{pr[j]:.6f}")])
    return csv_path


def _print_table(console, app, paths, names, top_idx, top_p) -> None:
    base = app.input if os.path.isdir(app.input) else os.path.dirname(app.input) or "."
    table = Table(show_edge=False, pad_edge=False, box=None)
    table.add_column("image")
    table.add_column("prediction")
    table.add_column("prob", justify="right")
    table.add_column(f"top-{top_idx.shape[1]}")
    for p, idx, pr in list(zip(paths, top_idx, top_p))[: max(0, app.show)]:
        rest = " ".join(f"{names[i]}:{q:.2f}" for i, q in zip(idx, pr))
        table.add_row(shown(os.path.relpath(p, base)), names[idx[0]], f"{pr[0]:.3f}", rest)
    if app.show > 0:
        Console(width=max(100, console.width)).print(table)  # stdout, never wrapped into a mess in a pipe
    if len(paths) > app.show > 0:
        print(f"... {len(paths) - app.show} more in predictions.csv")


if __name__ == "__main__":  # `python -m runner.predict`: the console script's entry point (runner/cli/commands.py)
    from runner.cli.commands import predict

    predict()
