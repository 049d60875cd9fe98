"""Validation while training, the monitored best checkpoint and early stopping, through the CLI."""

import csv
import json

import numpy as np
import pytest
from conftest import TINY, compose_cfg, metrics, module_in_process, outputs_of, run_cli, run_in_process


@pytest.mark.slow
def test_validation_every_n_epochs_curve_best_and_logger(tmp_path):
    run_in_process(tmp_path, *TINY, "epochs=3", "validation.every_epochs=2", "checkpoint.top_k=2")
    m = metrics(tmp_path)
    # Every 2 epochs, and always after the last one.
    assert [p["epoch"] for p in m["val_curve"]] == [2.0, 3.0]
    assert [p["step"] for p in m["val_curve"]] == [88, 132]
    # The final numbers are the last validation's (the same weights): fit's validation is the evaluation.
    assert m["val_accuracy"] == m["val_curve"][-1]["accuracy"] and m["val_loss"] == m["val_curve"][-1]["loss"]
    # With validation during training the best checkpoint is the one of the highest val accuracy.
    best = m["best_checkpoint"]
    top = max(m["val_curve"], key=lambda p: p["accuracy"])  # max() keeps the first of equals, as "better" does
    assert best["monitor"] == "val_accuracy" and best["value"] == top["accuracy"] and best["step"] == top["step"]
    state = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    assert (
        state["best"]["file"] == f"step_{top['step']:08d}.ckpt"
        and (tmp_path / "checkpoints" / state["best"]["file"]).exists()
    )
    # checkpoint.top_k=2: both validated epochs are kept, best first.
    ranked = sorted(m["val_curve"], key=lambda p: -p["accuracy"])  # stable: the earlier of equals first
    assert [t["step"] for t in m["top_checkpoints"]] == [p["step"] for p in ranked] and m["top_checkpoints"][0] == best
    assert [t["file"] for t in state["top_k"]] == [f"step_{p['step']:08d}.ckpt" for p in ranked]
    assert m["compile_count"] == 1  # validating between epochs does not recompile the train graph
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    logged = [(int(r["step"]), float(r["val_accuracy"])) for r in rows if r.get("val_accuracy")]
    assert logged[:2] == [(p["step"], p["accuracy"]) for p in m["val_curve"]]
    # Resumed from epoch 2 into a new directory: the curve continues, with the same numbers.
    resumed = tmp_path / "resumed"
    run_in_process(
        resumed, *TINY, "epochs=3", "validation.every_epochs=2", f"resume={tmp_path}/checkpoints/step_00000088.ckpt"
    )
    r = metrics(resumed)
    assert r["val_curve"] == m["val_curve"]


def _expected_stop(values, patience, min_delta, higher_better=True):
    """The epoch index at which `patience` checks in a row fail to beat the best by min_delta, or None."""
    best, wait = None, 0
    for i, v in enumerate(values):
        wait += 1
        if best is None or (v > best + min_delta if higher_better else v < best - min_delta):
            best, wait = v, 0
        if wait >= patience:
            return i
    return None


@pytest.mark.slow
def test_early_stop_stops_on_a_plateau_and_keeps_the_best(tmp_path):
    # A learning rate of 1e-7 leaves validation flat: accuracy cannot gain 2 points.
    run_in_process(
        tmp_path, *TINY, "epochs=8", "validation.every_epochs=1", "optim.lr=1e-7",
        "early_stop.patience=2", "early_stop.min_delta=0.02",
    )  # fmt: skip
    m = metrics(tmp_path)
    accs = [p["accuracy"] for p in m["val_curve"]]
    stop = _expected_stop(accs, 2, 0.02)
    assert stop is not None and stop == len(accs) - 1 < 7  # it stopped at the first epoch the rule says
    es = m["early_stop"]
    assert es["stopped"] and es["epoch"] == stop + 1 and es["step"] == m["steps"] == 44 * (stop + 1)
    assert "val_accuracy did not improve by more than 0.02 for 2" in es["reason"]
    best = m["best_checkpoint"]
    assert best["value"] == max(accs) and es["restored"] == best["file"]
    # The best checkpoint's weights became model.ckpt, and the final numbers are theirs.
    import mindspore as ms

    final = ms.load_checkpoint(str(tmp_path / "model.ckpt"))
    saved = ms.load_checkpoint(best["file"])
    assert all(np.array_equal(final[k].asnumpy(), saved[k].asnumpy()) for k in final)
    assert m["val_accuracy"] == best["value"]
    assert "early stop at epoch" in (tmp_path / "runner.log").read_text()
    # And runner.evaluate of the run (model.ckpt) reproduces them.
    out = outputs_of(module_in_process("runner.evaluate", f"run={tmp_path}"))
    assert json.loads((out / "metrics.json").read_text())["top1"] == m["val_accuracy"]


@pytest.mark.slow
def test_early_stop_with_ema_keeps_and_restores_the_best_average(tmp_path):
    # train_loss cannot fall by 1.0 in an epoch: the run stops after epoch 2 and restores the best checkpoint.
    run_cli(tmp_path, *TINY, "epochs=4", "eval=false", "early_stop.patience=1", "early_stop.min_delta=1.0",
            "ema.decay=0.9")  # fmt: skip
    m = metrics(tmp_path)
    assert m["early_stop"]["stopped"] and m["ema_decay"] == 0.9 and m["best_checkpoint"]["step"] in (44, 88)
    import mindspore as ms

    final = ms.load_checkpoint(str(tmp_path / "model.ckpt"))
    best = ms.load_checkpoint(m["best_checkpoint"]["file"])
    # model.ckpt is the best checkpoint's average, not its raw weights (which differ from it)
    assert all(np.array_equal(final[k].asnumpy(), best["ema." + k].asnumpy()) for k in final)
    assert not all(np.array_equal(final[k].asnumpy(), best[k].asnumpy()) for k in final)
    # and ckpt=best in evaluate reads the same average
    from runner import saved_model
    from runner.rundir import saved_run
    from runner.rundir.layout import read_checkpoint

    cfg = saved_run.load_config(str(tmp_path))
    _, net = saved_model.build(cfg)
    record = saved_model.load_weights(net, read_checkpoint(m["best_checkpoint"]["file"]), "best", cfg)
    assert record["ema"] and all(np.array_equal(p.asnumpy(), final[p.name].asnumpy()) for p in net.get_parameters())


@pytest.mark.slow
def test_early_stop_on_train_loss_without_validation(tmp_path):
    run_in_process(tmp_path, *TINY, "epochs=6", "eval=false", "optim.lr=1e-7", "early_stop.patience=1",
            "early_stop.min_delta=1.0")  # fmt: skip
    m = metrics(tmp_path)
    assert m["early_stop"]["stopped"] and m["early_stop"]["monitor"] == "train_loss" and m["steps"] == 88
    assert m["best_checkpoint"]["monitor"] == "train_loss" and m["val_curve"] == [] and m["val_accuracy"] is None


@pytest.mark.parametrize(
    "overrides, culprit",
    [
        (["checkpoint.monitor=val_accuracy", "eval=false"], "checkpoint.monitor=val_accuracy"),
        (["checkpoint.monitor=val_loss", "validation.every_epochs=0"], "validation.every_epochs=0"),
        (
            ["early_stop.patience=2", "early_stop.monitor=val_loss", "validation.every_epochs=0"],
            "early_stop.monitor=val_loss",
        ),
        (["validation.every_epochs=2", "eval=false"], "eval=false"),
        (["validation.every_epochs=50"], "beyond epochs"),
        (["early_stop.min_delta=0.1"], "early_stop.patience=0"),
        (["early_stop.patience=2", "checkpoint.every_epochs=0"], "checkpoint.every_epochs"),
        (["early_stop.patience=2", "checkpoint.keep_best=false"], "checkpoint.keep_best"),
        (
            [
                "validation.every_epochs=1",
                "early_stop.patience=2",
                "early_stop.monitor=val_loss",
                "checkpoint.monitor=val_accuracy",
            ],
            "differs",
        ),  # fmt: skip
        (["checkpoint.monitor=best"], "checkpoint.monitor"),
    ],
)
def test_conflicting_watch_settings_are_refused(tmp_path, overrides, culprit):
    proc = run_in_process(tmp_path, *TINY, "dry_run=true", *overrides, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert culprit in " ".join(proc.stderr.split())


def test_validation_epochs_follow_data_epochs_under_a_sink_size():
    from runner.training.validation import validation_epochs

    # 10 steps per data epoch; Model epochs of 10 steps (no sink size): every 2 epochs, and the last.
    assert validation_epochs(2, 5, 10, 10, 5) == [2, 4, 5]
    assert validation_epochs(0, 5, 10, 10, 5) == [5]
    # sink_size 4: Model epochs end at steps 4, 8, ..., 52; data epochs 2 and 4 end at steps 20 and 40.
    assert validation_epochs(2, 5, 10, 4, 13) == [5, 10, 13]
    # The default, every epoch, of a very long run: planned at once (it was quadratic: minutes before the run).
    assert validation_epochs(1, 100_000, 44, 44, 100_000) == list(range(1, 100_001))


def test_validation_is_every_epoch_by_default_and_picks_the_best_checkpoint(tiny_run):
    # Issue 39: validation only after the last epoch, and the best checkpoint chosen by the training loss.
    from runner.config.schema import validation_every

    cfg = compose_cfg(*TINY)
    assert cfg.validation.every_epochs is None and validation_every(cfg.validation, cfg.eval) == 1
    assert validation_every(compose_cfg(*TINY, "eval=false").validation, False) == 0  # no error, no validation
    m = metrics(tiny_run)
    assert m["best_checkpoint"]["monitor"] == "val_accuracy" and m["val_curve"][-1]["step"] == 44


def test_score_direction_and_nan():
    from runner.training.validation import Score

    acc, loss = Score("val_accuracy"), Score("val_loss")
    assert acc.better(0.5, 0.4) and not acc.better(0.41, 0.4, min_delta=0.02) and acc.better(0.0, None)
    assert loss.better(0.3, 0.4) and not loss.better(0.5, 0.4) and not loss.better(float("nan"), 0.4)


def test_top_k_keeps_the_k_best_besides_the_last_and_resumes_the_ranking(tmp_path):
    from types import SimpleNamespace

    from mindspore import nn

    from runner.rundir.run_state import RunState
    from runner.training.checkpoints import Checkpointer
    from runner.training.validation import Score

    def checkpointer(top_k, start):
        cfg = SimpleNamespace(every_epochs=1, keep_last=1, keep_best=True, top_k=top_k, on_signal=True)
        return Checkpointer(cfg, str(tmp_path), 10, RunState(start), Score("train_loss"))

    def files():
        return sorted(int(p.name[5:13]) for p in tmp_path.glob("step_*.ckpt"))

    ck, net = checkpointer(2, {}), nn.Dense(2, 2)
    for step, loss in zip((10, 20, 30, 40, 50, 60), (1.0, 0.5, 0.7, 0.4, 0.9, 0.6)):
        ck.save(SimpleNamespace(train_network=net, cur_step_num=step), loss)
    # The two lowest losses (steps 40, 20) and the last one (60); each pushed-out best was deleted.
    assert files() == [20, 40, 60]
    state = json.loads((tmp_path / "latest.json").read_text())
    assert [(b["global_step"], b["value"]) for b in state["top_k"]] == [(40, 0.4), (20, 0.5)]
    assert state["best"] == state["top_k"][0] and ck.enters_top(0.45) and not ck.enters_top(0.55)
    # A resume continues the ranking: 0.45 enters, 20 leaves.
    state["path"] = str(tmp_path / state["latest"])
    resumed = checkpointer(2, state)
    resumed.save(SimpleNamespace(train_network=net, cur_step_num=10), 0.45)  # global step 60 + 10
    # 70 is the latest and among the best: keep_last=1 is met by it, so 60 goes (counted once, not twice).
    assert [b["global_step"] for b in resumed.top] == [40, 70] and files() == [40, 70]
    assert [b["global_step"] for b in checkpointer(1, state).top] == [40]  # top_k lowered on resume


def test_top_k_settings_it_cannot_honour_are_refused():
    from conftest import compose_cfg

    from runner.config.checks import validate
    from runner.errors import ConfigError

    for overrides, message in (
        (["checkpoint.top_k=0"], "checkpoint.top_k must be at least 1"),
        (["checkpoint.top_k=3", "checkpoint.keep_best=false"], "checkpoint.keep_best=false keeps none"),
        (["checkpoint.top_k=3", "checkpoint.every_epochs=0"], "checkpoint.every_epochs=0 saves none"),
        (["checkpoint.keep_last=0"], "checkpoint.keep_last must be at least 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            validate(compose_cfg(*overrides))


def test_resumed_best_of_another_monitor_starts_afresh(tmp_path):
    from types import SimpleNamespace

    from runner.rundir.run_state import RunState
    from runner.training.checkpoints import Checkpointer
    from runner.training.validation import Score

    cfg = SimpleNamespace(every_epochs=1, keep_last=2, keep_best=True, top_k=1, on_signal=True)
    old = {"global_step": 20, "best": {"file": "step_00000020.ckpt", "loss": 0.5, "global_step": 20}}
    same = Checkpointer(cfg, str(tmp_path), 10, RunState(old), Score("train_loss"))
    other = Checkpointer(cfg, str(tmp_path), 10, RunState(old), Score("val_accuracy"))
    assert same.best == {"file": "step_00000020.ckpt", "monitor": "train_loss", "value": 0.5, "global_step": 20}
    assert other.best is None
