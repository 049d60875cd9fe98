"""What evaluate, predict, export and init_from are given to read (a run's config.yaml, its checkpoints,
its recorded classes): anything that cannot give a result is refused with one paragraph, in-process."""

import json

import numpy as np
import pytest
from conftest import TINY, compose_cfg

from runner.errors import ConfigError


def fake_run(run_dir, *overrides):
    """A run directory as training leaves it (config.yaml, model.ckpt of a fresh network), without training."""
    import mindspore as ms

    from runner import saved_model
    from runner.report.outputs import write_config
    from runner.rundir import saved_run

    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = compose_cfg(*TINY, *overrides)
    write_config(str(run_dir), cfg)
    cfg = saved_run.load_config(str(run_dir))
    saved_model.set_up_device(cfg)
    _, net = saved_model.build(cfg)
    ms.save_checkpoint(net, str(run_dir / "model.ckpt"))
    return cfg, net


def rewrite_checkpoint(path, change):
    """Save path again with change(name, array) -> array applied to every entry."""
    import mindspore as ms

    params = ms.load_checkpoint(str(path))
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(change(n, p.asnumpy()))} for n, p in params.items()], str(path))


def test_a_checkpoint_holding_nan_is_refused_by_the_commands_and_init_from(tmp_path):
    from runner import saved_model
    from runner.training.finetune import load_matching

    cfg, net = fake_run(tmp_path / "run")
    ckpt = tmp_path / "run" / "model.ckpt"
    rewrite_checkpoint(ckpt, lambda n, a: np.full_like(a, np.nan) if n == "head.bias" else a)
    with pytest.raises(ConfigError, match=r"NaN or infinity \(head.bias\)"):
        saved_model.open_run(str(tmp_path / "run"), "final", cfg)  # evaluate, predict and export open it so
    with pytest.raises(ConfigError, match=r"NaN or infinity \(head.bias\)"):
        load_matching(net, str(ckpt))


def test_a_float16_checkpoint_loads_and_an_int32_one_is_refused(tmp_path):
    import mindspore as ms

    from runner import saved_model
    from runner.training.finetune import load_matching

    cfg, _ = fake_run(tmp_path / "run")
    ckpt = tmp_path / "run" / "model.ckpt"
    rewrite_checkpoint(ckpt, lambda n, a: a.astype(np.float16))
    saved = saved_model.open_run(str(tmp_path / "run"), "final", cfg)
    half = {n: p.asnumpy() for n, p in ms.load_checkpoint(str(ckpt)).items()}
    for p in saved.net.get_parameters():  # cast to the network's float32, values kept
        assert p.asnumpy().dtype == np.float32 and np.array_equal(p.asnumpy(), half[p.name].astype(np.float32))
    rewrite_checkpoint(ckpt, lambda n, a: a.astype(np.int32))
    with pytest.raises(ConfigError, match=r"non-float data \(.*Int32\)"):
        saved_model.open_run(str(tmp_path / "run"), "final", cfg)
    with pytest.raises(ConfigError, match=r"non-float data"):
        load_matching(saved.net, str(ckpt))


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "is empty"),
        ("- model\n- data\n", "holds a list"),
        ("model: [1, 2\n", "cannot be read as a runner configuration (ParserError"),
        ("model: 3\n", "cannot be read as a runner configuration"),
        ("epochs: 2\n", "cannot be read as a runner configuration (Missing mandatory value"),
    ],
)
def test_a_malformed_config_yaml_is_refused_by_evaluate_and_resume(tmp_path, text, words):
    from runner.rundir import resume_check, saved_run

    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"config.yaml") as e:
        saved_run.load_config(str(tmp_path))
    assert words in str(e.value)
    if "(Missing" not in words and "model: 3" not in text:  # resume reads the file itself (then compares values)
        with pytest.raises(ConfigError, match=r"config.yaml (is empty|holds a list|cannot be read)"):
            resume_check.check_against_saved(compose_cfg(*TINY), str(tmp_path), str(tmp_path / "new"), [])


@pytest.mark.parametrize(
    "state", ["{not json", "[]", '{"latest": 3}', '{"latest": "../../etc/x.ckpt"}', '{"best": {}}']
)
def test_a_corrupt_latest_json_is_refused_by_ckpt_last_and_init_from(tmp_path, state):
    from runner.rundir import saved_run
    from runner.rundir.saved_run import source_path

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step_00000001.ckpt").write_bytes(b"")
    (tmp_path / "checkpoints" / "latest.json").write_text(state)
    for ckpt in ("last", "best"):
        with pytest.raises(ConfigError, match=rf"ckpt={ckpt}: .*latest.json is unreadable"):
            saved_run.checkpoint_path(str(tmp_path), ckpt)
    with pytest.raises(ConfigError, match=r"init_from=.*latest.json is unreadable"):
        source_path(str(tmp_path))


def test_latest_json_naming_a_missing_file_is_refused(tmp_path):
    from runner.rundir import saved_run
    from runner.rundir.saved_run import source_path

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.json").write_text(json.dumps({"latest": "step_00000009.ckpt", "best": None}))
    with pytest.raises(ConfigError, match=r"ckpt=last: .*names step_00000009.ckpt, which is missing"):
        saved_run.checkpoint_path(str(tmp_path), "last")
    with pytest.raises(ConfigError, match=r"names step_00000009.ckpt, which is missing"):
        source_path(str(tmp_path))


def _predict(run_dir, input_dir, out_dir):
    from omegaconf import OmegaConf

    from runner.predict import PredictConfig, predict

    out_dir.mkdir()
    app = OmegaConf.structured(PredictConfig(run=str(run_dir), input=str(input_dir), topk=2, show=0))
    return predict(app, str(out_dir))


def test_predict_skips_and_lists_what_it_cannot_decode_and_never_opens_a_fifo(tmp_path, monkeypatch):
    import os
    import signal

    from PIL import Image

    fake_run(tmp_path / "run")
    images = tmp_path / "images"
    images.mkdir()
    Image.new("L", (8, 8), 100).save(images / "good.png")
    Image.new("L", (8, 8), 50).save(os.fsdecode(bytes(images) + b"/caf\xe9.png"))  # a Latin-1 file name
    os.mkfifo(images / "x.png")  # opening it would wait for a writer forever
    Image.fromarray(np.ones((8, 8), np.float32), mode="F").save(images / "float.png", format="TIFF")
    Image.new("L", (40, 40), 10).save(images / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 1600 pixels: over twice the limit, PIL refuses it
    signal.alarm(120)  # a hang fails the test instead of blocking the suite
    try:
        summary = _predict(tmp_path / "run", images, tmp_path / "out")
    finally:
        signal.alarm(0)
    skipped = {os.path.basename(s["path"]): s["reason"] for s in summary["skipped"]}
    assert sorted(skipped) == ["bomb.png", "float.png", "x.png"], skipped
    assert "FIFO" in skipped["x.png"] and "decompression bomb" in skipped["bomb.png"]
    assert "MindSpore's Decode cannot read this TIFF F image" == skipped["float.png"]
    rows = (tmp_path / "out" / "predictions.csv").read_text(encoding="utf-8").splitlines()
    assert summary["images"] == 2 and len(rows) == 3  # the header and both readable images
    assert any(r.startswith(str(images / "caf\\xe9.png") + ",") for r in rows), rows


def test_predict_refuses_an_input_that_is_a_fifo(tmp_path):
    import os

    from runner.errors import InputError
    from runner.predict import find_images

    os.mkfifo(tmp_path / "x.png")
    with pytest.raises(InputError, match=r"x.png: not a regular file \(a FIFO\)"):
        find_images(str(tmp_path / "x.png"))


def _folder_run(tmp_path):
    """A fake run on an image folder of ten word-named classes, with the classes.json training writes."""
    from conftest import folder_run_args, word_digit_folder

    from runner.datasets import build_data
    from runner.rundir import saved_run

    root = word_digit_folder(tmp_path / "digits", sizes=[(8, 8)], per_class=2, val_per_class=2)
    cfg, _ = fake_run(tmp_path / "run", *folder_run_args(root)[1:], "batch_size=4")
    saved_run.write_classes(str(tmp_path / "run"), build_data(cfg.data, cfg.padding, 4, 0))
    return tmp_path / "run", root


def _evaluate(run_dir, out_dir, **fields):
    from omegaconf import OmegaConf

    from runner.evaluate import EvaluateConfig, evaluate

    out_dir.mkdir()
    app = OmegaConf.structured(EvaluateConfig(run=str(run_dir)))
    for k, v in fields.items():
        OmegaConf.update(app, k, v)
    return evaluate(app, str(out_dir)).to_dict()


@pytest.mark.slow
def test_classes_renamed_or_a_subset_are_refused_or_mapped_by_name(tmp_path):
    import shutil

    from conftest import DIGIT_WORDS

    run, root = _folder_run(tmp_path)
    assert json.loads((run / "classes.json").read_text())["names"] == sorted(DIGIT_WORDS)
    renamed = tmp_path / "renamed"
    shutil.copytree(root, renamed)
    for split in ("train", "val"):
        for w in DIGIT_WORDS:
            (renamed / split / w).rename(renamed / split / f"class_{DIGIT_WORDS.index(w)}")
    for classes in ("strict", "by_name"):
        with pytest.raises(ConfigError, match=r"other classes than the run was trained on .*class_0"):
            _evaluate(run, tmp_path / f"out_{classes}", **{"data.root": str(renamed), "classes": classes})
    subset = tmp_path / "subset"
    for split in ("train", "val"):
        for w in ("five", "one", "two"):
            shutil.copytree(root / split / w, subset / split / w)
    with pytest.raises(ConfigError, match=r"classes=by_name maps"):
        _evaluate(run, tmp_path / "out_subset", **{"data.root": str(subset)})
    m = _evaluate(run, tmp_path / "out_mapped", **{"data.root": str(subset), "classes": "by_name"})
    samples = {n: c["samples"] for n, c in m["per_class"].items()}
    assert m["num_classes"] == 10 and samples == {
        w: 2 if w in ("five", "one", "two") else 0 for w in sorted(DIGIT_WORDS)
    }


def test_predict_labels_with_the_classes_the_run_trained_on(tmp_path):
    from conftest import DIGIT_WORDS

    run, root = _folder_run(tmp_path)
    for split in ("train", "val"):  # the training folder's classes renamed after the run
        for i, w in enumerate(DIGIT_WORDS):
            (root / split / w).rename(root / split / f"class_{i}")
    _predict(run, root / "val", tmp_path / "out")
    rows = (tmp_path / "out" / "predictions.csv").read_text().splitlines()[1:]
    assert rows and all(r.split(",")[1] in DIGIT_WORDS for r in rows)


def test_init_from_matches_the_head_to_the_data_classes_by_name(tmp_path):
    import mindspore as ms
    from conftest import DIGIT_WORDS

    from runner import saved_model
    from runner.rundir import saved_run
    from runner.training.finetune import load_matching

    run, _ = _folder_run(tmp_path)
    rewrite_checkpoint(run / "model.ckpt", lambda n, a: a * 3 if n.startswith("head.") else a)  # not a fresh head
    source = ms.load_checkpoint(str(run / "model.ckpt"))
    recorded = sorted(DIGIT_WORDS)
    cfg = saved_run.load_config(str(run))
    order = list(reversed(range(10)))  # the same classes, in another order (a class_indexing of their own)
    _, net = saved_model.build(cfg)
    record = load_matching(net, str(run), [recorded[i] for i in order])
    assert record["classes"]["mapped_by_name"] and "head.weight" in record["loaded"]
    assert np.array_equal(net.head.weight.asnumpy(), source["head.weight"].asnumpy()[order])
    _, net = saved_model.build(cfg)
    record = load_matching(net, str(run), [f"class_{i}" for i in range(10)])  # other classes: a fresh head
    assert record["reinitialised"] == ["head.weight", "head.bias"] and not record["classes"]["mapped_by_name"]
    assert not np.array_equal(net.head.weight.asnumpy(), source["head.weight"].asnumpy())


@pytest.mark.slow  # ~50 s: two evaluations through Hydra's multirun
def test_evaluate_multirun_writes_into_the_run_not_the_working_directory(tmp_path):
    from conftest import cli_in_process

    fake_run(tmp_path / "run", "mode=pynative", "data.val_fraction=0.05")  # no graph to compile, 90 samples
    (tmp_path / "cwd").mkdir()
    proc = cli_in_process(
        "-m", f"run={tmp_path / 'run'}", "batch_size=64,128", app="runner.cli.commands:evaluate", cwd=tmp_path / "cwd"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list((tmp_path / "cwd").iterdir())  # no ./multirun/<time>
    (sweep,) = (tmp_path / "run").glob("evaluate-multirun-*")
    assert (sweep / "0" / "metrics.json").is_file() and (sweep / "1" / "metrics.json").is_file()
    fake_run(tmp_path / "other")
    proc = cli_in_process(
        "-m", f"run={tmp_path / 'run'},{tmp_path / 'other'}", app="runner.cli.commands:evaluate", cwd=tmp_path / "cwd"
    )
    assert proc.returncode == 2 and "needs hydra.sweep.dir=<new directory>" in " ".join(proc.stderr.split())
    assert not list((tmp_path / "cwd").iterdir())


@pytest.mark.slow
def test_evaluate_sweeps_several_runs_into_the_sweep_dir_it_is_given(tiny_run, tmp_path):
    from conftest import cli_in_process

    # Under -m hydra.run.dir (${run}/evaluate-<time>) is never used: pre-flight must not try to resolve it.
    proc = cli_in_process(
        "-m", f"run={tiny_run},{tiny_run}", f"hydra.sweep.dir={tmp_path}", app="runner.cli.commands:evaluate"
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["0", "1"]
    assert all((tmp_path / n / "metrics.json").is_file() for n in ("0", "1"))


@pytest.mark.slow
def test_evaluate_fp32_is_a_setting_of_its_own_on_the_command_line(tiny_run, tmp_path):
    from conftest import cli_in_process

    # `amp` is the training config group; evaluate's switch must not collide with it (amp=false was refused).
    out = tmp_path / "fp32"
    proc = cli_in_process(
        f"run={tiny_run}", "use_amp=false", f"hydra.run.dir={out}", app="runner.cli.commands:evaluate"
    )
    assert proc.returncode == 0, proc.stderr
    import json

    assert json.loads((out / "metrics.json").read_text())["amp_level_used"] == "O0"
