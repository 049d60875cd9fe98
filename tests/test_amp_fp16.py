"""amp.dtype: float16 on a CPU is FP16 numerics on the FP32 fast path; bfloat16 on a CPU is refused early.

models/fp16.py rounds the FP32 body's activations (and, through the Cast pairs' backward, their gradients)
to float16 at the operator edges. These tests show the rounding is what they claim: an input above FP16's
65504 and a loss scale of 2^24 overflow under O2 float16 and do not under O0 on the same network.
"""

import json
import math

import numpy as np
import pytest
from conftest import metrics, module_in_process, outputs_of, run_cli, run_in_process


def _step(level, conv, *, target="CPU", keep=(), input_scale=1.0, loss_scale=1024.0):
    """One train step of a tiny ResNet: (loss, names of parameters with non-finite gradients, blocked body)."""
    import mindspore as ms
    from mindspore import nn

    from runner.amp import build_loss_net
    from runner.amp.train_step import ScaledTrainStep
    from runner.models.resnet import resnet

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = resnet("cifar", 8, 8, 10, 1, 8, conv=conv)
    _, loss_net = build_loss_net(net, level, list(keep), ".", dtype="float16", device_target=target)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.0)
    step = ScaledTrainStep(loss_net, opt, "fixed", loss_scale, 2.0, 1000, False, grad_stats=True)
    step.set_train(True)
    x = ms.Tensor(np.random.RandomState(0).uniform(-1, 1, (4, 1, 8, 8)).astype(np.float32) * input_scale)
    y = ms.Tensor(np.arange(4, dtype=np.int32))
    loss, _, _, stats = step(x, y)
    bad = [p.name for p, (_, n) in zip(opt.parameters, stats.asnumpy()) if n > 0]
    return float(loss.asnumpy()), bad, net.blocked_body


@pytest.mark.cpu_only
# The default path (onednn on a CPU with a compiler) in the default suite; the native one (35 s) with the slow tests.
@pytest.mark.parametrize("conv", [pytest.param("native", marks=pytest.mark.slow), "onednn"])
def test_o2_float16_on_cpu_overflows_as_fp16_on_the_fp32_body(conv):
    # The fast path keeps the FP32 body (blocked where model.conv gives one) and matches MindSpore's FP16 O2.
    loss, bad, blocked = _step("O2", conv)
    assert blocked == (conv == "onednn") and bad == []
    reference, _, _ = _step("O2", conv, target="")  # "": MindSpore's auto_mixed_precision float16 kernels
    assert loss == pytest.approx(reference, rel=2e-3)
    # An input above 65504 is inf at the network's entry under FP16, and finite under FP32.
    assert "stem.0.weight" in _step("O2", conv, input_scale=1e5)[1]
    assert _step("O0", conv, input_scale=1e5)[1] == []
    # An FP32 island keeps its input and outputs unrounded.
    loss, bad, _ = _step("O2", conv, keep=["stem"], input_scale=1e5)
    assert math.isfinite(loss) and bad == []
    # Gradients are rounded too: a loss scale of 2^24 overflows FP16 gradients, not FP32 ones.
    assert _step("O2", conv, loss_scale=2.0**24)[1] and _step("O0", conv, loss_scale=2.0**24)[1] == []


@pytest.mark.cpu_only
def test_bfloat16_on_a_cpu_is_refused_with_the_missing_flag_before_training(tmp_path, tiny):
    proc = run_cli(tmp_path, "amp=o2", "amp.dtype=bfloat16", *tiny, check=False)
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "amp.dtype=bfloat16" in said and "avx512_bf16" in said and "amx_bf16" in said
    flags = open("/proc/cpuinfo").read()
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        assert "lacks avx512_bf16 and amx_bf16" in said and "3-4x slower" in said
    assert not (tmp_path / "metrics.json").exists()


def test_dtype_resolution():
    from runner.config.amp_dtype import bf16_cpu_problem, resolve_dtype

    assert resolve_dtype("auto", "O0", "CPU") == "float32"
    assert resolve_dtype("auto", "O2", "GPU") == "float16" == resolve_dtype("auto", "O2", "CPU")
    assert resolve_dtype("bfloat16", "O2", "Ascend") == "bfloat16"
    assert "this CPU has avx512_bf16" in bf16_cpu_problem(frozenset({"avx2", "avx512_bf16"}))
    assert "lacks avx512_bf16 and amx_bf16" in bf16_cpu_problem(frozenset({"avx2"}))


@pytest.mark.cpu_only
def test_an_o2_float16_run_records_its_dtypes_and_evaluates_to_its_accuracy(tmp_path, tiny):
    run = tmp_path / "run"
    run_in_process(run, "amp=o2", "amp.dtype=float16", *tiny)
    m = metrics(run)
    assert m["amp_level_used"] == "O2" and m["amp_dtype_used"] == "float16"
    assert "rounded to float16" in m["amp_compute"]["body"] and m["amp_compute"]["loss"] == "float32"
    assert m["flops"]["body_layout"].startswith("nChw")  # the fast blocked body, not MindSpore's FP16 kernels
    assert m["loss_scale"]["type"] == "dynamic"
    import mindspore as ms

    weights = ms.load_checkpoint(str(run / "model.ckpt")) if (run / "model.ckpt").exists() else None
    if weights is None:
        from safetensors.numpy import load_file

        weights = {k: ms.Tensor(v) for k, v in load_file(str(run / "model.safetensors")).items()}
    assert weights["stem.0.weight"].dtype == ms.float32  # FP32 master weights are what is saved
    out = outputs_of(module_in_process("runner.evaluate", f"run={run}"))
    top1 = json.loads((out / "metrics.json").read_text())["top1"]
    assert top1 == pytest.approx(m["val_accuracy"], abs=1e-9)


@pytest.mark.slow
@pytest.mark.cpu_only
def test_an_o2_float16_run_exports_to_its_numbers_and_fine_tunes(tmp_path, tiny):
    run = tmp_path / "run"
    run_in_process(run, "amp=o2", "amp.dtype=float16", *tiny)
    out = outputs_of(module_in_process("runner.export", f"run={run}", "format=mindir", "parity_samples=10"))
    record = json.loads((out / "export.json").read_text())
    assert record["parity_ok"] and record["max_abs_diff"] <= 1e-4  # the FP32 file against the run's network
    tuned = tmp_path / "tuned"
    run_in_process(tuned, "amp=o2", "amp.dtype=float16", f"init_from={run}", *tiny)
    m = metrics(tuned)
    assert m["amp_dtype_used"] == "float16" and "head.weight" in m["fine_tune"]["loaded"]
    assert m["loss_curve"][0] < metrics(run)["loss_curve"][0]  # it started from the trained weights
