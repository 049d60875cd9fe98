"""Fine-tuning: init_from loads what matches, optim.freeze keeps cells fixed, wrong sources are refused."""

import numpy as np
import pytest
from conftest import TINY, built_once, metrics, run_cli, run_in_process
from imagegen import digit_folder


def _weights(path) -> dict:
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}


@pytest.fixture(scope="module")
def folder5(tmp_path_factory):
    """A 5-class image folder of RGB/gray/RGBA digit renderings (data.channels=3 by default)."""
    return built_once(tmp_path_factory, "folder5", lambda root: digit_folder(
        root, [(8, 8), (12, 10)], per_class=24, classes=5, val_per_class=8, seed=3))  # fmt: skip


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_run, folder5):
    """The 10-class digits run fine-tuned on the 5-class folder with stem and layer1 frozen."""
    return built_once(tmp_path_factory, "finetuned", lambda run_dir: run_in_process(
        run_dir, *TINY, "epochs=2", f"init_from={tiny_run}", "data=imagefolder", f"data.root={folder5}",
        "optim.freeze=[stem, layer1]"))  # fmt: skip


@pytest.mark.slow
def test_init_from_lowers_the_starting_loss(tmp_path, tiny_run):
    run_in_process(tmp_path, *TINY, f"init_from={tiny_run}")
    fresh, tuned = metrics(tiny_run), metrics(tmp_path)
    assert tuned["fine_tune"]["reinitialised"] == [] and tuned["fine_tune"]["init_from"].endswith("model.ckpt")
    # The same data, seed and order: only the starting weights differ.
    assert tuned["loss_curve"][0] < 0.25 * fresh["loss_curve"][0], (tuned["loss_curve"][0], fresh["loss_curve"][0])


@pytest.mark.slow
def test_new_head_and_adapted_stem_are_listed(finetuned, tiny_run):
    ft = metrics(finetuned)["fine_tune"]
    assert ft["reinitialised"] == ["head.weight", "head.bias"]  # 10 -> 5 classes
    assert ft["adapted"] == ["stem.0.weight"]  # digits are 1-channel, the folder is read as RGB
    assert "layer3.0.conv2.weight" in ft["loaded"] and ft["frozen"] == ["stem", "layer1"]
    log = (finetuned / "runner.log").read_text()
    assert "freshly initialised (absent or of another shape): head.weight, head.bias" in log


@pytest.mark.slow
def test_frozen_cells_are_bit_identical_after_training(finetuned, tiny_run):
    before, after = _weights(tiny_run / "model.ckpt"), _weights(finetuned / "model.ckpt")
    frozen = [k for k in after if k.startswith(("stem.", "layer1."))]
    assert len(frozen) >= 9 and any("moving_mean" in k for k in frozen)  # BatchNorm statistics too
    for k in frozen:
        want = np.repeat(before[k], 3, axis=1) / 3 if k == "stem.0.weight" else before[k]
        assert np.array_equal(after[k], want.astype(after[k].dtype)), k
    # What is not frozen did train.
    assert not np.array_equal(after["layer2.0.conv1.weight"], before["layer2.0.conv1.weight"])


def test_a_checkpoint_of_another_architecture_is_refused(tmp_path):
    import mindspore as ms
    from mindspore import nn

    other = tmp_path / "other.ckpt"
    ms.save_checkpoint(nn.SequentialCell([nn.Dense(3, 4), nn.Dense(4, 2)]), str(other))
    proc = run_in_process(tmp_path / "run", *TINY, f"init_from={other}", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    text = " ".join(proc.stderr.split())
    assert "shares no parameter" in text and str(other) in text


@pytest.mark.parametrize(
    "value, culprit",
    [("nowhere/model.ckpt", "does not exist"), ("{tmp}", "holds no model.ckpt")],
)
def test_a_missing_source_is_refused(tmp_path, value, culprit):
    proc = run_in_process(
        tmp_path / "run", *TINY, "dry_run=true", f"init_from={value.format(tmp=tmp_path)}", check=False
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and culprit in " ".join(proc.stderr.split())


def test_freeze_patterns_are_checked():
    from conftest import compose_cfg

    from runner.errors import ConfigError
    from runner.models import build_model
    from runner.training.finetune import freeze

    cfg = compose_cfg(*TINY)
    net = build_model(cfg.model, 10, 1, 8)
    with pytest.raises(ConfigError, match=r"optim.freeze names no cell: \['stme'\]"):
        freeze(net, ["stme"])
    with pytest.raises(ConfigError, match="nothing would train"):
        freeze(build_model(cfg.model, 10, 1, 8), ["*"])
    with pytest.raises(ConfigError, match=r"\['\*relu'\] select\(s\) only cells without parameters"):
        freeze(net, ["stem", "*relu"])  # activations: a pattern that freezes nothing is refused
    assert len(net.trainable_params()) == len(build_model(cfg.model, 10, 1, 8).trainable_params())  # nothing frozen
    record = freeze(net, ["layer*.0.bn1"])  # globs, as amp.keep_fp32
    assert record["frozen"] == ["layer1.0.bn1", "layer2.0.bn1", "layer3.0.bn1"]
    assert not any(p.name.startswith("layer1.0.bn1") for p in net.trainable_params())
    assert net.layer1[0].bn1.use_batch_statistics is False


@pytest.mark.slow
def test_finetune_reaches_scratch_accuracy_in_fewer_epochs(tmp_path, tiny_run, folder5):
    """docs/fine-tuning.md's measurement, small: a 5-class folder from scratch vs from the 10-class digits run."""
    common = [*TINY, "epochs=6", "validation.every_epochs=1", "data=imagefolder", f"data.root={folder5}"]
    run_cli(tmp_path / "scratch", *common)
    run_cli(tmp_path / "tuned", *common, f"init_from={tiny_run}")
    scratch = [p["accuracy"] for p in metrics(tmp_path / "scratch")["val_curve"]]
    tuned = [p["accuracy"] for p in metrics(tmp_path / "tuned")["val_curve"]]
    target = max(scratch)
    first = lambda accs: next(i for i, a in enumerate(accs) if a >= target) + 1  # noqa: E731
    assert max(tuned) >= target and first(tuned) < first(scratch), (scratch, tuned)
