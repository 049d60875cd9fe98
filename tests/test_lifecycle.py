"""A finished run used as a model, through the real commands: evaluate, predict, export."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    DIGIT_WORDS,
    REPO,
    folder_run_args,
    metrics,
    module_in_process,
    outputs_of,
    run_cli,
    run_module,
    word_digit_folder,
)
from PIL import Image


def predictions(out_dir) -> list:
    with open(Path(out_dir) / "predictions.csv", newline="") as f:
        return list(csv.DictReader(f))


def top1_of(rows) -> float:
    """Share of rows whose first label is the class folder the file lies in."""
    return float(np.mean([Path(r["path"]).parent.name == r["label_1"] for r in rows]))


# ---- evaluate ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_evaluate_reproduces_the_runs_val_accuracy(folder_run_evaluated):
    run, root, m = folder_run_evaluated
    assert m["top1"] == metrics(run)["val_accuracy"]
    assert m["samples"] == 40 and m["num_classes"] == 10
    assert m["top5"] is not None and m["top1"] <= m["top5"] <= 1.0  # 10 classes: top-5 is reported
    # Names come from the class folders, in the data's label order (sorted names, not digit order).
    names = m["confusion"]["labels"]
    assert names == sorted(DIGIT_WORDS)
    matrix = np.array(m["confusion"]["matrix"])
    assert matrix.sum() == 40 and all(m["per_class"][n]["samples"] == 4 for n in names)
    assert np.trace(matrix) / 40 == pytest.approx(m["top1"])
    for i, n in enumerate(names):
        assert m["per_class"][n]["accuracy"] == pytest.approx(matrix[i, i] / 4)
    assert m["loss_batch_mean"] == pytest.approx(metrics(run)["val_loss"], rel=1e-5)
    # 40 samples in batches of 16, 16, 8: the per-sample mean weighs the last batch by its size.
    assert np.isfinite(m["loss"]) and m["loss"] > 0 and m["loss"] != m["loss_batch_mean"]
    assert Path(m["plot"]).name == "confusion.png" and Path(m["plot"]).stat().st_size > 0


def test_the_run_records_its_class_names(folder_run):
    run, _ = folder_run
    assert json.loads((run / "classes.json").read_text()) == {"names": sorted(DIGIT_WORDS), "num_classes": 10}


@pytest.mark.slow
def test_evaluate_a_resumable_checkpoint_by_path(folder_run_evaluated):
    run, root, final = folder_run_evaluated
    # The last resumable checkpoint holds the final weights (plus optimizer state, ignored here).
    by_path = module_in_process(
        "runner.evaluate", f"run={run}", f"ckpt={next((run / 'checkpoints').glob('step_*.ckpt'))}"
    )
    last = json.loads((outputs_of(by_path) / "metrics.json").read_text())
    assert last["top1"] == final["top1"] and Path(last["checkpoint"]).parent.name == "checkpoints"


@pytest.mark.slow
def test_evaluate_on_other_data_with_the_runs_preprocessing(folder_run, tmp_path):
    run, _ = folder_run
    # Another folder with the same classes: evaluated with the run's preprocessing, on its own images.
    other = word_digit_folder(tmp_path / "other", sizes=[(20, 20)], per_class=2, val_per_class=3, seed=5)
    proc = module_in_process("runner.evaluate", f"run={run}", f"data.root={other}")
    m = json.loads((outputs_of(proc) / "metrics.json").read_text())
    assert m["samples"] == 30 and m["data_overrides"] == {"root": str(other)}
    assert "top1 " in proc.stdout and "30 samples" in proc.stdout


# ---- predict -----------------------------------------------------------------------------------


def test_predict_agrees_with_evaluate_and_skips_unreadable_files(folder_run_evaluated, tmp_path):
    run, root, m = folder_run_evaluated
    images = tmp_path / "val"
    shutil.copytree(root / "val", images)
    (images / "three" / "broken.png").write_bytes(b"not an image")
    Image.new("L", (8, 8), 128).save(images / "three" / "really_a.png", format="GIF")  # PIL reads it, Decode not
    # batch_size 7 does not divide 40: the last batch is partial, and rows must still match their files.
    proc = module_in_process("runner.predict", f"run={run}", f"input={images}", "topk=3", "batch_size=7")
    out = outputs_of(proc)
    rows = predictions(out)
    assert len(rows) == 40 and list(rows[0]) == ["path", "label_1", "prob_1", "label_2", "prob_2", "label_3", "prob_3"]
    assert top1_of(rows) == m["top1"]
    for r in rows:
        probs = [float(r[f"prob_{j}"]) for j in (1, 2, 3)]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        assert {r["label_1"], r["label_2"], r["label_3"]} <= set(DIGIT_WORDS)
    for name in ("broken.png", "really_a.png"):
        assert name in proc.stdout + proc.stderr and name not in {Path(r["path"]).name for r in rows}
    skipped = json.loads((out / "predict.json").read_text())["skipped"]
    assert sorted(Path(s["path"]).name for s in skipped) == ["broken.png", "really_a.png"]
    assert "40 images classified, 2 unreadable skipped" in proc.stdout
    assert not list(Path(REPO).glob("unsupported_image*"))  # what Decode dumps when it meets a GIF


def test_predict_one_file(folder_run):
    run, root = folder_run
    image = next((root / "val" / "seven").glob("*.png"))
    proc = module_in_process("runner.predict", f"run={run}", f"input={image}", "topk=20")
    rows = predictions(outputs_of(proc))
    assert len(rows) == 1 and rows[0]["path"] == str(image)
    assert "label_10" in rows[0] and "label_11" not in rows[0]  # topk is capped at the number of classes
    assert sum(float(rows[0][f"prob_{j}"]) for j in range(1, 11)) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "padding",
    [
        ("padding=bucket", "padding.buckets=[8,16]"),  # 16x24 is larger than the last bucket: shrunk into it
        ("padding=none",),
        ("padding.method=resize_pad", "padding.height=12", "padding.width=12"),
        ("padding.method=crop", "padding.height=8", "padding.width=8"),
    ],
)
def test_predict_many_sizes_with_every_padding(tmp_path, padding):
    root = word_digit_folder(tmp_path / "digits", per_class=8, val_per_class=4)
    run = tmp_path / "run"
    run_cli(run, *folder_run_args(root, padding))
    top1 = json.loads((outputs_of(module_in_process("runner.evaluate", f"run={run}")) / "metrics.json").read_text())[
        "top1"
    ]
    assert top1 == metrics(run)["val_accuracy"]
    rows = predictions(
        outputs_of(module_in_process("runner.predict", f"run={run}", f"input={root / 'val'}", "batch_size=5"))
    )
    assert len(rows) == 40 and top1_of(rows) == top1
    # One exported file per input shape the padding makes: each bucket, else one.
    record = json.loads((outputs_of(module_in_process("runner.export", f"run={run}")) / "export.json").read_text())
    shapes = [f["input_shape"][2:] for f in record["files"]]
    assert shapes == ([[8, 8], [16, 16]] if "padding=bucket" in padding else shapes[:1])
    assert record["parity_ok"] and record["max_abs_diff"] <= 1e-4 and record["top1_agreement"] == 1.0


# ---- export ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,batch", [("mindir", 1), ("onnx", 4)])
@pytest.mark.slow
def test_export_matches_the_checkpoint(folder_run, fmt, batch):
    pytest.importorskip("onnxruntime") if fmt == "onnx" else None
    run, _ = folder_run
    proc = module_in_process("runner.export", f"run={run}", f"format={fmt}", f"batch_size={batch}", "parity_samples=10")
    out = outputs_of(proc)
    record = json.loads((out / "export.json").read_text())
    (file,) = record["files"]
    assert Path(file["path"]) == out / f"model.{fmt}" and file["input_shape"] == [batch, 1, 8, 8]
    # MINDIR's batch is fixed at batch_size; ONNX's axis is dynamic, checked at batch_size and 2 x batch_size + 1.
    assert file["parity"]["batch_sizes"] == ([batch, 2 * batch + 1] if fmt == "onnx" else [batch])
    # 10 images in chunks of 4: the last chunk is filled up, and its filler must not count.
    assert file["parity"]["samples"] == 10
    assert record["max_abs_diff"] <= 1e-4 and record["top1_agreement"] == 1.0 and record["parity_ok"]
    assert record["output"]["classes"] == sorted(DIGIT_WORDS)
    assert record["preprocessing"]["padding"] == {
        "name": "fixed",
        "height": 8,
        "width": 8,
        "method": "resize",
        "fill": 0,
    }


def test_export_of_an_operator_mindspore_cannot_convert_names_it(tmp_path):
    """MindSpore's real refusal (Cummax has no ONNX conversion in 2.10), turned into one paragraph."""
    from unconvertible import RunningMax

    from runner.errors import ConfigError
    from runner.export import write

    with pytest.raises(ConfigError, match="Cummax operator has no ONNX conversion"):
        write(RunningMax(), "onnx", (2, 3), str(tmp_path / "m"))


# ---- bad inputs: one paragraph each, exit 2, no traceback ----------------------------------------


def assert_clean_error(proc, *culprits):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    text = " ".join(proc.stderr.split())  # the CLI wraps its paragraph at the terminal's width
    for c in culprits:
        assert " ".join(str(c).split()) in text, proc.stderr


@pytest.mark.parametrize("command", ["runner.evaluate", "runner.predict", "runner.export"])
def test_a_directory_without_config_yaml_is_refused(tmp_path, command):
    (tmp_path / "model.ckpt").write_bytes(b"")
    proc = module_in_process(command, f"run={tmp_path}", "input=x.png", check=False)
    assert_clean_error(proc, tmp_path, "config.yaml")
    assert list(tmp_path.iterdir()) == [tmp_path / "model.ckpt"]  # nothing was created in it


def test_a_checkpoint_that_does_not_fit_is_refused(folder_run, tmp_path):
    import mindspore as ms

    run, root = folder_run
    # A checkpoint of the same architecture for 5 classes: its head has another shape.
    params = ms.load_checkpoint(str(run / "model.ckpt"))
    head = next(n for n, p in params.items() if tuple(p.shape) == (10, 32))
    params[head] = ms.Parameter(ms.Tensor(np.zeros((5, 32), np.float32)), name=head)
    misfit = tmp_path / "five_classes.ckpt"
    ms.save_checkpoint([{"name": n, "data": p} for n, p in params.items()], str(misfit))
    proc = module_in_process("runner.evaluate", f"run={run}", f"ckpt={misfit}", check=False)
    assert_clean_error(proc, misfit, head, "(10, 32) in the network, (5, 32) in the checkpoint")
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"\x00" * 100)
    image = next((root / "val" / "one").glob("*.png"))
    assert_clean_error(
        module_in_process("runner.predict", f"run={run}", f"ckpt={garbage}", f"input={image}", check=False), garbage
    )
    assert_clean_error(module_in_process("runner.export", f"run={run}", "ckpt=nope.ckpt", check=False), "nope.ckpt")


def test_an_image_that_cannot_be_read_is_refused(folder_run, tmp_path):
    run, _ = folder_run
    image = tmp_path / "scan.jpg"
    image.write_bytes(b"\xff\xd8\xff truncated")
    assert_clean_error(module_in_process("runner.predict", f"run={run}", f"input={image}", check=False), image)
    missing = tmp_path / "nowhere"
    assert_clean_error(module_in_process("runner.predict", f"run={run}", f"input={missing}", check=False), missing)


def test_an_export_format_that_is_not_installed_is_refused(folder_run, tmp_path):
    run, _ = folder_run
    # An environment without onnxruntime: a module of that name that fails to import, first on the path.
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "onnxruntime" / "__init__.py").write_text("raise ImportError('not installed')\n")
    shadow = {"PYTHONPATH": f"{tmp_path}"}
    before = set(run.glob("export-*/*"))
    proc = run_module("runner.export", f"run={run}", "format=onnx", check=False, env=shadow)
    assert_clean_error(proc, "format=onnx needs onnxruntime", "pip install -e '.[export]'")
    assert not [p for p in set(run.glob("export-*/*")) - before if p.suffix in (".onnx", ".json")]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux `script` for a pseudo-terminal")
def test_predict_shows_progress_bars_on_a_terminal(folder_run):
    import subprocess
    import sys

    run, root = folder_run
    # 40 images in batches of 4 are more than two batches: on a terminal, both bars appear.
    cmd = f"{sys.executable} -m runner.predict run={run} input={root / 'val'} batch_size=4 show=0"
    proc = subprocess.run(["script", "-qec", cmd, "/dev/null"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout
    assert "check" in proc.stdout and "predict" in proc.stdout and "/40" in proc.stdout
    plain = run_module("runner.predict", f"run={run}", f"input={root / 'val'}", "batch_size=4", "show=0")
    assert "/40" not in plain.stdout + plain.stderr  # never in a pipe or a log file
