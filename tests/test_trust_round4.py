"""Round 4 of the trust issue: checkpoints kept, the API's run directory, refusals quoting MindSpore."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import TINY, compose_cfg


def test_top_1_keep_last_1_keeps_one_file_when_the_best_is_the_last(tmp_path):
    from mindspore import nn

    from runner.training.checkpoints import Checkpointer
    from runner.training.validation import Score

    cfg = SimpleNamespace(every_epochs=1, keep_last=1, keep_best=True, top_k=1, on_signal=True)
    ck = Checkpointer(cfg, str(tmp_path), 10, {}, Score("train_loss", lambda: None), lambda: np.zeros(0))
    net = nn.Dense(2, 2)
    for step, loss in ((10, 1.0), (20, 0.5), (30, 0.4)):  # every epoch the best so far
        ck.save(SimpleNamespace(train_network=net, cur_step_num=step), loss)
    assert sorted(p.name for p in tmp_path.glob("step_*.ckpt")) == ["step_00000030.ckpt"]
    ck.save(SimpleNamespace(train_network=net, cur_step_num=40), 0.9)  # worse: the best and the last, two files
    assert sorted(p.name for p in tmp_path.glob("step_*.ckpt")) == ["step_00000030.ckpt", "step_00000040.ckpt"]
    state = json.loads((tmp_path / "latest.json").read_text())
    assert state["kept"] == ["step_00000030.ckpt", "step_00000040.ckpt"] and state["best"]["global_step"] == 30


def test_the_api_refuses_a_file_as_run_dir_as_the_cli_does(tmp_path):
    import runner

    run_dir = tmp_path / "a-file"
    run_dir.write_text("mine")
    with pytest.raises(runner.UserError, match="a-file.*not a directory"):
        runner.train(compose_cfg(*TINY), str(run_dir))
    assert run_dir.read_text() == "mine"
    with pytest.raises(runner.UserError, match="not a directory"):
        runner.train(compose_cfg(*TINY), str(run_dir / "below"))


@pytest.fixture
def read_only_cache(tmp_path):
    """$XDG_CACHE_HOME on a read-only bind mount that already holds mindspore-runner/ (EROFS, which is
    no PermissionError; root ignores chmod, so a mount is the only honest read-only folder here)."""
    import subprocess

    src, mnt = tmp_path / "src", tmp_path / "cache"
    (src / "mindspore-runner").mkdir(parents=True, mode=0o700)
    mnt.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(mnt)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)])


@pytest.mark.slow
def test_a_read_only_cache_falls_back_to_a_temporary_directory(read_only_cache, monkeypatch, caplog):
    import errno
    import logging
    import tempfile

    from runner.models import onednn
    from runner.models.errors import ModelError

    try:
        onednn.find_compiler()
    except ModelError:
        pytest.skip("no C++ compiler: the library is not built here")
    with pytest.raises(OSError) as e:
        (read_only_cache / "mindspore-runner" / "probe").write_text("x")
    assert e.value.errno == errno.EROFS
    monkeypatch.setenv("XDG_CACHE_HOME", str(read_only_cache))
    with caplog.at_level(logging.WARNING, logger="runner.models.onednn"):
        built = [onednn.library() for _ in range(3)]  # each onednn layer of a network asks for it
    assert built[0].startswith(tempfile.gettempdir()) and not built[0].startswith(str(read_only_cache))
    assert built == [built[0]] * 3
    said = [r.getMessage() for r in caplog.records if str(read_only_cache) in r.getMessage()]
    assert len(said) == 1 and "cannot write" in said[0], said  # one fact, said once per process


@pytest.mark.slow
def test_images_removed_mid_run_end_it_with_one_paragraph_naming_a_file(tmp_path):
    from conftest import start_cli, wait_for, word_digit_folder

    root = word_digit_folder(tmp_path / "data", per_class=12, val_per_class=1)
    run = tmp_path / "run"
    args = ["epochs=300", "padding.height=8", "padding.width=8", "model.width=8", "log_every=1000", "batch_size=16"]
    args += ["data=imagefolder", f"data.root={root}", "data.channels=1", "data.mean=[0.5]", "data.std=[0.5]"]
    proc = start_cli(run, *args)
    try:
        wait_for(proc, lambda: (run / "checkpoints" / "latest.json").exists())
        removed = sorted(root.glob("train/*/*.png"))
        for p in removed:
            p.unlink()
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    text = " ".join(out.split())
    assert proc.returncode == 2, out[-3000:]
    assert "The data changed while the run read it: '" in text and "Traceback" not in text
    named = text.split("The data changed while the run read it: '", 1)[1].split("'", 1)[0]
    assert named in {str(p) for p in removed}
    assert (run / "checkpoints" / "latest.json").exists() and list(run.glob("checkpoints/step_*.ckpt"))
