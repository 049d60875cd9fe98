"""Refusals keep the reason they quote (datasets/errors.py error_reason, the one helper), uncut."""

import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, TINY
from omegaconf import OmegaConf

from runner.datasets.errors import error_reason
from runner.errors import ConfigError


def test_a_long_yaml_error_keeps_its_reason_at_the_end(tmp_path):
    # PyYAML names the file twice and quotes the line before it says what is wrong.
    path = tmp_path / ("d" * 150) / "config.yaml"
    path.parent.mkdir()
    path.write_text('epochs: 1\nname: "' + "x" * 300 + "\n")
    with pytest.raises(yaml.YAMLError) as raw:
        OmegaConf.load(path)
    assert " ".join(str(raw.value).split()).index("found unexpected end of stream") > 200  # past the old cut

    from runner.rundir.resume_check import read_saved_config

    with pytest.raises(ConfigError) as refused:
        read_saved_config(str(path))
    assert "found unexpected end of stream" in str(refused.value), str(refused.value)
    assert str(path) in str(refused.value)


def test_a_mindspore_error_is_quoted_without_its_call_stack_and_with_its_reason():
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    with pytest.raises((ValueError, RuntimeError)) as raw:
        nn.Conv2d(3, 4, 3)(ms.Tensor(np.zeros((1, 5, 8, 8), np.float32)))
    text = error_reason(raw.value)
    assert "C++ Call Stack" in str(raw.value) and "C++" not in text and "----" not in text
    assert text.startswith("For 'Conv2D'") and text.endswith("'group': 1."), text


def test_a_saved_config_with_a_long_bad_value_still_names_its_key(tmp_path):
    from runner.rundir.saved_run import load_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"epochs: {'x' * 300}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(str(run))
    assert "full_key: epochs" in str(refused.value), str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize("logger,package", [("wandb", "wandb"), ("mlflow", "mlflow"), ("tensorboard", "tensorboardX")])
def test_a_logger_package_that_does_not_import_is_refused_before_mindspore_and_before_any_file(
    tmp_path, logger, package
):
    # Installed but broken: a package of that name first on the path, whose import fails (as a half-removed
    # or mismatched install does). find_spec finds it; only importing it tells.
    shadow = tmp_path / "shadow" / package
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(f"raise ImportError('{package} is broken here')\n")
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "runner",
        f"hydra.run.dir={run_dir}",
        *TINY,
        f"logger=[csv,{logger}]",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    message = " ".join(lines)
    assert proc.returncode == 2, proc.stdout[-2000:] + message
    assert [line.startswith("Error: ") for line in lines] == [True] + [False] * (
        len(lines) - 1
    ) and "Traceback" not in message, message
    assert f"logger={logger} needs {package}" in message and f"{package} is broken here" in message, message
    assert "pip install" in message, message
    assert not [m for m in imported if m.split(".")[0] == "mindspore"]
    assert not run_dir.exists() or not os.listdir(run_dir)
