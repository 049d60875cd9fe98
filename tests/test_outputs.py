"""The reproducibility contract: the saved config re-runs the run, the saved checkpoint evaluates the same."""

import os

import pytest
from conftest import metrics, run_cli, run_in_process
from docs_pages import page
from omegaconf import OmegaConf


@pytest.mark.slow
def test_rerun_from_saved_config_reproduces(tmp_path, tiny):
    first = tmp_path / "first"
    run_cli(first, "epochs=2", *tiny[1:])
    run_cli(None, "--config-path", str(first), "--config-name", "config")
    reruns = sorted(first.glob("rerun-*"))
    assert len(reruns) == 1
    a, b = metrics(first), metrics(reruns[0])
    # Same seed, same data order, same machine: the same losses bit for bit (measured: identical, 2026-12-04).
    assert a["loss_curve"] == b["loss_curve"]
    assert a["val_accuracy"] == b["val_accuracy"]


@pytest.mark.parametrize("amp", ["o0", "o2"])
@pytest.mark.slow
def test_checkpoint_round_trip(tmp_path, tiny, amp):
    import mindspore as ms
    from mindspore import Model, nn

    from runner.amp import loss_fn
    from runner.amp.train_step import FP32Logits
    from runner.config.schema import Config
    from runner.datasets import build_data
    from runner.models import build_model

    run_in_process(tmp_path, f"amp={amp}", *tiny)
    m = metrics(tmp_path)
    saved = OmegaConf.load(tmp_path / "config.yaml")
    cfg = OmegaConf.merge(
        OmegaConf.structured(Config), {k: v for k, v in saved.items() if k not in ("defaults", "hydra")}
    )

    ms.set_context(mode=ms.GRAPH_MODE)
    data = build_data(cfg.data, cfg.padding, cfg.batch_size, cfg.seed)
    net = build_model(cfg.model, data.num_classes, data.channels, data.height)
    params = ms.load_checkpoint(os.fspath(tmp_path / "model.ckpt"))
    assert all(p.dtype == ms.float32 for p in params.values())  # FP32 master weights, also after O2
    not_loaded, _ = ms.load_param_into_net(net, params, strict_load=True)
    assert not not_loaded
    acc = Model(FP32Logits(net), loss_fn=loss_fn(), metrics={"accuracy": nn.Accuracy()}).eval(data.val)["accuracy"]
    if amp == "o0":
        assert acc == m["val_accuracy"]
    else:
        # The run evaluated in FP16, the checkpoint evaluates in FP32: the same 359 predictions here (a 2-core AMD
        # EPYC with AVX-512 and AVX512_BF16, 2026-12-04); one sample whose top two logits FP16 cannot tell apart
        # may flip on another CPU's kernels, no more.
        assert abs(acc - m["val_accuracy"]) <= 1 / 359 + 1e-9


def _documented_metrics() -> dict:
    """key -> unit/meaning from the metrics.json table of docs/outputs.md."""
    table = page("outputs.md").split("<!-- metrics.json contract -->", 2)[1]
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| `")]
    return {cells[1].strip().strip("`"): cells[3].strip() for cells in rows}


def test_metrics_sections_write_the_documented_keys_in_order(tmp_path):
    from runner.report.metrics import RunMetrics

    # The typed sections (results, timing, ...) write one flat metrics.json: the table's keys, in its order.
    m = RunMetrics(val_accuracy=0.5, final_loss=0.25, steps=7, advice=["a note"])
    assert list(m.to_dict()) == list(_documented_metrics())
    # A metrics.json key is its section's field, read and set under its flat name as before the sections.
    assert (m.results.val_accuracy, m.timing.steps, m.files.advice) == (0.5, 7, ["a note"])
    m.compile_count = 3
    assert m.compiles.compile_count == 3 and m.to_dict()["compile_count"] == 3
    m.write(str(tmp_path / "metrics.json"))
    assert RunMetrics.read(str(tmp_path / "metrics.json")) == m
    with pytest.raises(TypeError, match="no field nope"):
        RunMetrics(nope=1)
    with pytest.raises(AttributeError, match="nope"):
        m.nope = 1


def test_metrics_json_follows_the_documented_contract(tiny_run):
    import typing

    from runner.report.metrics import RunMetrics

    m = metrics(tiny_run)
    fields = {f.name: f.type for f in RunMetrics.keys()}
    documented = _documented_metrics()
    # The file, the record and the documentation name the same keys, each documented with its meaning.
    assert set(m) == set(fields) == set(documented), (set(m) ^ set(fields)) | (set(fields) ^ set(documented))
    assert all(documented.values())
    for key, kind in fields.items():
        allowed = typing.get_args(kind) if typing.get_origin(kind) is typing.Union else (kind,)
        plain = tuple(
            {list: list, dict: dict}.get(typing.get_origin(t) or t, typing.get_origin(t) or t) for t in allowed
        )
        plain += (int,) if float in plain else ()  # JSON writes 2.0 as 2.0 but a whole count may be an int
        assert isinstance(m[key], tuple(t if t is not type(None) else type(None) for t in plain)), (key, m[key])
