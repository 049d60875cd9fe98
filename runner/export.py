"""`python -m runner.export run=<run dir> format=mindir|onnx`.

Exports a run's FP32 network with the input size from the run's padding, then checks the exported file
against the checkpoint's own network on validation images: MINDIR reloaded with mindspore.load +
nn.GraphCell, ONNX run in onnxruntime. The MINDIR file's batch is fixed (batch_size); the ONNX file's batch axis
is dynamic (`batch`, as torch.onnx's dynamic_axes gives it), and its parity check runs it at batch_size and at
another batch size. `<run>/export-<time>/export.json` records the largest absolute difference of the logits and
the agreement of top-1.
"""

import importlib
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from importlib import metadata

import numpy as np
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from runner import saved_model
from runner.datasets.settings import Choice
from runner.errors import ConfigError, UserError
from runner.report.outputs import versions
from runner.rundir import saved_run
from runner.rundir.atomic import write_json
from runner.rundir.saved_run import DataOverrides

log = logging.getLogger("runner")
# Lazy imports: MindSpore loads only after open_run set the CPU ISA cap; onnx and onnxruntime are the
# optional `export` extra, imported only for format=onnx.


class ExportFormat(Choice):
    mindir = "mindir"
    onnx = "onnx"


# What each format's parity check needs beyond MindSpore, as pip names them (the `export` extra).
NEEDS = {"mindir": [], "onnx": [("onnx", "onnx"), ("onnxruntime", "onnxruntime")]}
SUFFIX = {"mindir": ".mindir", "onnx": ".onnx"}


@dataclass
class ExportConfig:
    run: str = MISSING  # the training run's directory (holds config.yaml)
    format: ExportFormat = ExportFormat.mindir
    ckpt: str = "final"  # final (model.ckpt) | last | best | a .ckpt path
    batch_size: int = 1  # MINDIR: the input's (fixed) batch; ONNX: the traced batch (its batch axis is dynamic)
    parity_samples: int = 32  # validation images the exported file is checked on, per exported shape
    tolerance: float = 1e-4  # largest |logit difference| the parity check accepts
    data: DataOverrides = field(default_factory=DataOverrides)  # e.g. data.root=... if the training data moved


ConfigStore.instance().store(name="export_schema", node=ExportConfig)


def check_installed(fmt: str) -> None:
    """A ConfigError naming the missing package when the format's parity check cannot run here."""
    missing = []
    for module, pip in NEEDS[fmt]:
        try:  # imported, not only looked up: a broken installation is as unusable as a missing one
            importlib.import_module(module)
        except ImportError:
            missing.append(pip)
    if missing:
        raise ConfigError(
            f"format={fmt} needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
            f"installed in this environment ({sys.executable}): install the runner's export extra, "
            "pip install -e '.[export]' (versions that keep numpy below 2), or export format=mindir, "
            "which needs nothing beyond MindSpore."
        )


def input_shapes(cfg, data) -> list:
    """(height, width) of each exported file: the run's fixed size, each bucket, or for padding=none the
    most frequent training size (the shape most of its batches had)."""
    if cfg.padding.name == "fixed":
        return [(cfg.padding.height, cfg.padding.width)]
    if cfg.padding.name == "bucket":
        return [(b, b) for b in cfg.padding.buckets]
    sizes = data.padding["input_sizes"]  # {"HxW": training samples}
    h, w = max(sizes, key=sizes.get).split("x")
    return [(int(h), int(w))]


def refusal(err: Exception, fmt: str):
    """A ConfigError naming the operator when MindSpore refuses to convert the network, else None."""
    text = str(err)
    m = re.search(r"Exporting (\w+) operator is not yet supported", text) or re.search(
        r"Can not find key (\w+) in convert map", text
    )
    if not m:
        return None
    return ConfigError(
        f"MindSpore cannot convert this network to {fmt.upper()}: its {m.group(1)} operator has no {fmt.upper()} "
        "conversion in this MindSpore version. Export format=mindir (every MindSpore operator converts), or "
        f"change the model so it avoids {m.group(1)}."
    )


def write(net, fmt: str, shape: tuple, path_base: str) -> str:
    """mindspore.export (MINDIR) or mindspore.onnx.export of net for one fixed input shape; the file's path."""
    import mindspore as ms
    from mindspore import Tensor

    x = Tensor(np.zeros(shape, np.float32))
    try:
        if fmt == "onnx":
            # MindSpore 2.10 deprecates mindspore.export(file_format='ONNX') for mindspore.onnx.export.
            ms.onnx.export(
                net,
                x,
                file_name=path_base + ".onnx",
                input_names=["images"],
                output_names=["logits"],
                dynamic_axes={"images": {0: BATCH_AXIS}},
            )
            dynamic_output_batch(path_base + ".onnx")
        else:
            ms.export(net, x, file_name=path_base, file_format="MINDIR")
    except (RuntimeError, TypeError, ValueError) as e:
        refused = refusal(e, fmt)
        if refused is None:
            raise
        raise refused from None
    return path_base + SUFFIX[fmt]


BATCH_AXIS = "batch"  # the ONNX file's name for its dynamic batch dimension


def dynamic_output_batch(path: str) -> None:
    """Mark the ONNX file's outputs' first axis as the dynamic batch too. MindSpore's dynamic_axes marks only the
    inputs, and leaves the outputs' batch at the traced size: onnxruntime then warns on every call at another batch
    ("Expected shape from model of {1,10} does not match actual shape of {3,10}"), and a tool that reads the
    declared output shape would allocate for one image."""
    import onnx

    model = onnx.load(path)
    for output in model.graph.output:
        dims = output.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_param = BATCH_AXIS
    onnx.save(model, path)


class Exported:
    """An exported file run the way a deployment would run it (GraphCell / onnxruntime session)."""

    def __init__(self, fmt: str, path: str):
        self.fmt = fmt
        if fmt == "onnx":
            import onnx
            import onnxruntime as ort

            onnx.checker.check_model(path)
            self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            self.input = self.session.get_inputs()[0].name
            self.dynamic_batch = not isinstance(self.session.get_inputs()[0].shape[0], int)
        else:
            import mindspore as ms
            from mindspore import nn

            self.cell = nn.GraphCell(ms.load(path))
            self.dynamic_batch = False

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.fmt == "onnx":
            return self.session.run(None, {self.input: x})[0]
        from mindspore import Tensor

        return self.cell(Tensor(x)).asnumpy()


def parity_images(dataset, shapes: list, limit: int) -> dict:
    """Per (h, w) in shapes: up to `limit` validation images of that size, normalized as the network sees
    them. One pass: a MindSpore pipeline refuses a second iterator that projects columns again."""
    found = {tuple(s): [] for s in shapes}
    for batch in dataset.create_tuple_iterator(num_epochs=1, output_numpy=True):
        images = batch[0]
        have = found.get(tuple(images.shape[2:]))
        if have is not None:
            have.extend(images[: limit - len(have)])
        if all(len(v) >= limit for v in found.values()):
            break
    return {s: np.stack(v) if v else np.zeros((0,), np.float32) for s, v in found.items()}


def parity(net, exported: Exported, images: np.ndarray, batch: int) -> dict:
    """Logits of the exported file against the checkpoint's own network, in chunks of the exported batch; a file
    with a dynamic batch axis also in chunks of another size (2 x batch + 1), so that the axis is shown to work."""
    from mindspore import Tensor

    sizes = [batch, 2 * batch + 1] if exported.dynamic_batch else [batch]
    ours_all, theirs_all = [], []
    for size in sizes:
        ours, theirs = [], []
        for i in range(0, len(images), size):
            chunk = images[i : i + size]
            n = len(chunk)
            if n < size and not exported.dynamic_batch:  # a fixed batch dimension: fill it, drop the filler's outputs
                chunk = np.concatenate([chunk, np.zeros((size - n, *chunk.shape[1:]), chunk.dtype)])
            ours.append(net(Tensor(chunk)).asnumpy()[:n])
            theirs.append(np.asarray(exported(chunk))[:n])
        ours_all.append(np.concatenate(ours))
        theirs_all.append(np.concatenate(theirs))
    ours, theirs = np.concatenate(ours_all), np.concatenate(theirs_all)
    return {
        "samples": int(len(images)),
        "batch_sizes": sizes,
        "max_abs_diff": float(np.max(np.abs(ours - theirs))),
        "top1_agreement": float(np.mean(ours.argmax(1) == theirs.argmax(1))),
    }


def export(app, out_dir: str) -> dict:
    """Export app.run's network as app.format, check parity, write export.json; return its content."""
    fmt = str(app.format)
    _check_request(app, fmt)  # before anything heavy
    cfg, saved = _open_for_export(app, fmt)
    shapes = input_shapes(cfg, saved.data)
    samples = parity_images(saved.data.val, shapes, app.parity_samples)
    files = [
        _write_one(saved.net, app, fmt, (app.batch_size, saved.data.channels, h, w), samples[(h, w)], out_dir, shapes)
        for h, w in shapes
    ]
    result = _record(app, fmt, cfg, saved, files)
    write_json(os.path.join(out_dir, "export.json"), result)
    _refuse_a_mismatch(result, fmt, os.path.join(out_dir, "export.json"))
    worst, checked = result["max_abs_diff"], [f["parity"] for f in files if f["parity"]]
    batches = sorted({b for c in checked for b in c.get("batch_sizes", [])})
    any_batch = f" (any batch; checked at {' and '.join(map(str, batches))})" if result["input"]["batch"] else ""
    print(
        f"{fmt.upper()} {', '.join(os.path.basename(f['path']) for f in files)} | input "
        f"{'/'.join('x'.join(map(str, f['input_shape'])) for f in files)}{any_batch} | max |diff| {worst:.2e} | "
        f"top-1 agreement {result['top1_agreement']:.4f} on {sum(c['samples'] for c in checked)} val images | "
        f"outputs: {out_dir}",
        flush=True,
    )
    return result


def _check_request(app, fmt: str) -> None:
    check_installed(fmt)
    if app.batch_size < 1 or app.parity_samples < 1:
        raise ConfigError(
            f"batch_size and parity_samples must be positive, got {app.batch_size} and {app.parity_samples}."
        )


def _open_for_export(app, fmt: str):
    """(the run's config, saved_model.open_run's record) with the network in graph mode, inference."""
    cfg = saved_run.load_config(app.run, app.data)
    # The file holds MindSpore's own Conv2D whatever model.conv trained: onednn's AOT operator is a path to
    # a library on this machine and gemm's im2col matrices are large constants. Parameters are the same.
    cfg.model.conv = "native"
    settings = {"format": fmt, "batch_size": app.batch_size, "parity_samples": app.parity_samples}
    saved = saved_model.open_run(app.run, app.ckpt, cfg, None, "export", settings)
    import mindspore as ms  # only now: open_run set the CPU ISA cap before MindSpore loaded

    ms.set_context(mode=ms.GRAPH_MODE)  # export traces the network as a graph, whatever mode it trained in
    saved.net.set_train(False)
    return cfg, saved


def _write_one(net, app, fmt: str, shape: tuple, images, out_dir: str, shapes: list) -> dict:
    """One exported file of this input shape and its parity check on images (None: no image of its shape)."""
    h, w = shape[2:]
    path = write(net, fmt, shape, os.path.join(out_dir, "model" if len(shapes) == 1 else f"model_{h}x{w}"))
    check = parity(net, Exported(fmt, path), images, app.batch_size) if len(images) else None
    if check:
        log.info(
            "%s: max |difference| %.3g over %d validation images, top-1 agreement %.4f",
            os.path.basename(path),
            check["max_abs_diff"],
            check["samples"],
            check["top1_agreement"],
        )
    else:
        log.warning("%s: no validation image of %dx%d to check it on", os.path.basename(path), h, w)
    return {"path": path, "input_shape": list(shape), "bytes": os.path.getsize(path), "parity": check}


def _record(app, fmt: str, cfg, saved, files: list) -> dict:
    """export.json: the files, their parity, and what a deployment must know (classes, preprocessing)."""
    data = saved.data
    checked = [f["parity"] for f in files if f["parity"]]
    worst = max((c["max_abs_diff"] for c in checked), default=None)
    return {
        "format": fmt,
        "files": files,
        "max_abs_diff": worst,
        "top1_agreement": min((c["top1_agreement"] for c in checked), default=None),
        "tolerance": app.tolerance,
        "parity_ok": worst is not None and worst <= app.tolerance,
        "checkpoint": saved.checkpoint["path"],
        "run": os.path.abspath(app.run),
        "device_target": saved.target,
        # batch: the dynamic batch axis's name (ONNX), None where the batch is fixed at input_shape[0] (MINDIR).
        "input": {
            "name": "images",
            "layout": "NCHW",
            "dtype": "float32",
            "batch": BATCH_AXIS if fmt == "onnx" else None,
        },
        "output": {
            "name": "logits",
            "classes": saved_run.class_names(
                data, saved_run.num_outputs(cfg, data, app.run), saved_run.recorded_classes(app.run)
            ),
        },
        # What a deployment must do to an image before the network sees it (the run's preprocessing).
        "preprocessing": {
            "channels": data.channels,
            "scale": "pixel / 255",
            "mean": list(cfg.data.mean),
            "std": list(cfg.data.std),
            "padding": saved_run.padding_record(cfg.padding),
        },
        "versions": {**versions(), **_format_versions(fmt)},
        "compile_cache": saved_model.cache_done("export"),
    }


def _refuse_a_mismatch(result: dict, fmt: str, record: str) -> None:
    if result["parity_ok"]:
        return
    worst, tolerance = result["max_abs_diff"], result["tolerance"]
    what = f"max |difference| {worst:.3g} > tolerance {tolerance:g}" if worst is not None else "no image to check"
    raise UserError(f"The exported {fmt.upper()} file does not match the checkpoint's network ({what}); see {record}.")


def _format_versions(fmt: str) -> dict:
    return {p: metadata.version(p) for _, p in NEEDS[fmt]}


if __name__ == "__main__":  # `python -m runner.export`: the console script's entry point (runner/cli/commands.py)
    from runner.cli.commands import export

    export()
