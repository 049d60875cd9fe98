"""checkpoint.format=safetensors: the final weights as model.safetensors (MindSpore's save_checkpoint(format=
"safetensors")), read by every command that reads a run's weights; and the ONNX export's dynamic batch axis."""

import json

import numpy as np
import pytest
from conftest import TINY, metrics, module_in_process, outputs_of, run_cli, run_in_process

SAFE = "checkpoint.format=safetensors"


@pytest.fixture(scope="module")
def safetensors_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("safe") / "run"
    run_in_process(run, *TINY, SAFE)
    return run


def test_the_final_weights_are_safetensors_and_evaluate_reads_them(safetensors_run):
    from safetensors.numpy import load_file

    run = safetensors_run
    assert (run / "model.safetensors").exists() and not (run / "model.ckpt").exists()
    assert metrics(run)["checkpoint"] == str(run / "model.safetensors")
    weights = load_file(str(run / "model.safetensors"))  # a plain safetensors file: any reader opens it
    assert "head.weight" in weights and weights["head.weight"].dtype == np.float32
    # The resumable checkpoints keep MindSpore's own format (the step and the optimizer's state ride in them).
    assert list((run / "checkpoints").glob("step_*.ckpt"))
    top1 = json.loads((outputs_of(module_in_process("runner.evaluate", f"run={run}")) / "metrics.json").read_text())
    assert top1["top1"] == pytest.approx(metrics(run)["val_accuracy"], abs=1e-6)


def test_resume_names_the_run_when_given_the_final_weights(safetensors_run, tmp_path):
    proc = run_in_process(tmp_path / "r", *TINY, f"resume={safetensors_run / 'model.safetensors'}", check=False)
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "hold only the final weights" in said and f"resume={safetensors_run} " in said


@pytest.mark.slow
def test_export_init_from_and_an_extended_resume_read_safetensors(safetensors_run, tmp_path):
    pytest.importorskip("onnxruntime")
    run = safetensors_run
    record = json.loads(
        (outputs_of(module_in_process("runner.export", f"run={run}", "format=onnx")) / "export.json").read_text()
    )
    assert record["parity_ok"] and record["checkpoint"] == str(run / "model.safetensors")
    tuned = tmp_path / "tuned"
    # Each in its own process: the export above set this one's oneDNN ISA cap.
    run_cli(tuned, *TINY, f"init_from={run}")
    assert metrics(tuned)["fine_tune"]["init_from"].endswith("model.safetensors")
    run_cli(tmp_path / "file", *TINY, f"init_from={run / 'model.safetensors'}")
    # One more epoch on the finished run, back in MindSpore's format: one file of final weights is left.
    run_cli(run, *[o for o in TINY if not o.startswith("epochs=")], "epochs=2", "resume=true", "checkpoint.format=ckpt")
    assert (run / "model.ckpt").exists() and not (run / "model.safetensors").exists()


def test_runner_convert_writes_safetensors_that_init_from_reads(tmp_path):
    from test_convert import resnet18_state_dict, save_safetensors

    from runner.convert import convert_torch
    from runner.rundir.layout import read_checkpoint

    src = save_safetensors(resnet18_state_dict(), tmp_path / "r18.safetensors")
    record = convert_torch(str(src), str(tmp_path / "ms.safetensors"), image_size=32, show=None)
    assert record.out == str(tmp_path / "ms.safetensors") and "init_from=" in record.usage()
    written = read_checkpoint(str(tmp_path / "ms.safetensors"))
    assert np.array_equal(written["stem.0.weight"].asnumpy(), resnet18_state_dict()["conv1.weight"])


@pytest.mark.slow
def test_the_onnx_export_has_a_dynamic_batch_axis_checked_at_another_batch_size(tiny_run):
    pytest.importorskip("onnxruntime")
    import onnx
    import onnxruntime as ort

    proc = module_in_process("runner.export", f"run={tiny_run}", "format=onnx", "parity_samples=8")
    out = outputs_of(proc)
    record = json.loads((out / "export.json").read_text())
    (file,) = record["files"]
    assert record["input"]["batch"] == "batch" and file["parity"]["batch_sizes"] == [1, 3]
    assert record["parity_ok"] and file["parity"]["samples"] == 8
    assert "(any batch; checked at 1 and 3)" in proc.stdout
    model = onnx.load(file["path"])
    for value in (model.graph.input[0], model.graph.output[0]):
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch"  # the logits' batch follows the input's
    session = ort.InferenceSession(file["path"], providers=["CPUExecutionProvider"])
    logits = session.run(None, {"images": np.zeros((5, 1, 8, 8), np.float32)})[0]
    assert logits.shape == (5, len(record["output"]["classes"]))
    assert "does not match actual shape" not in proc.stderr  # onnxruntime's warning for a fixed output batch
