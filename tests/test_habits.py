"""Habits users bring from other trainers, through the real console scripts: timm's and MindCV's `--model x --epochs 1`,
`--version`, lightning-hydra-template's `experiment=quick`, and a misspelled key, which gets the closest real ones
and never a suggestion that fails in turn (Hydra's own `+data.batch_size`)."""

import re
import subprocess

import pytest
from conftest import cli_in_process
from test_commands import script

from runner.config.suggest import closest


def paragraph(text: str) -> str:
    return " ".join(text.split())


def test_argparse_options_are_answered_once_with_their_key_value_translation(tmp_path):
    proc = script("runner-train", "--model=resnet50", "--epochs", "1", "amp=o2", "--lr", "0.1", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    said = paragraph(proc.stderr)
    assert said.count("Error:") == 1 and "usage:" not in proc.stderr and "Traceback" not in proc.stderr
    # `--lr` is the one setting whose last part it is; the rest of the command line is kept.
    assert "`--model=resnet50 --epochs 1 --lr 0.1` is `model=resnet50 epochs=1 optim.lr=0.1`" in said, said
    assert "the command is: runner-train amp=o2 model=resnet50 epochs=1 optim.lr=0.1." in said
    assert not any(tmp_path.iterdir())  # nothing written
    # The translation it prints runs as written.
    command = re.search(r"the command is: (runner-train .*?)\. `", said).group(1)
    ran = script(*command.split(), "dry_run=true", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    # A name that is no setting gets the nearest real ones; Hydra's own options still work.
    proc = script("runner-evaluate", "--run", "outputs/x", "--ckptt=best", cwd=tmp_path)
    said = paragraph(proc.stderr)
    assert proc.returncode == 2 and "`--run outputs/x --ckptt=best` is `run=outputs/x ckptt=best`" in said, said
    assert "ckptt is not a setting (did you mean ckpt?)" in said


def test_version_prints_the_runners_mindspores_and_hydras_once():
    from importlib import metadata

    proc = script("runner-train", "--version")
    assert proc.returncode == 0 and proc.stderr == ""
    (line,) = proc.stdout.splitlines()
    assert line.startswith(f"runner-train {metadata.version('mindspore-runner')} (mindspore-runner;")
    assert f"MindSpore {metadata.version('mindspore')}" in line and f"Hydra {metadata.version('hydra-core')}" in line


def test_experiment_selects_a_preset_as_lightning_hydra_template_spells_it(tmp_path):
    proc = script("runner-train", "experiment=quick", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0 and "\nepochs: 2\n" in proc.stdout and "experiment_name: quick" in proc.stdout
    proc = cli_in_process("+experiment=quick", "--cfg", "job", cwd=tmp_path)  # the + of earlier releases works too
    assert proc.returncode == 0 and "\nepochs: 2\n" in proc.stdout, proc.stderr
    # The empty slot changes nothing else: the default run, its groups, and the help text with every setting.
    default = cli_in_process("--cfg", "job", cwd=tmp_path)
    assert "\nepochs: 12\n" in default.stdout and "experiment" not in default.stdout.replace("experiment_name", "")
    helped = cli_in_process("--help", cwd=tmp_path)
    assert helped.returncode == 0 and "presets: experiment=quick" in helped.stdout
    assert "Settings and their defaults" in helped.stdout and "\nepochs: 12\n" in helped.stdout
    # Two of Hydra's modes at once is one paragraph too (Hydra raises a ValueError of its own).
    both = cli_in_process("-m", "experiment=quick", "--cfg", "job", cwd=tmp_path)
    assert both.returncode == 2 and "Traceback" not in both.stderr and "--cfg" in both.stderr, both.stderr


def test_a_copied_experiment_says_how_to_run_it_and_that_runs(tmp_path):
    # A .yaml path outside a folder named after its group: Hydra cannot select it there, and the answer says so.
    proc = script("runner-configs", "cp", "experiment/quick", "./my.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = paragraph(proc.stdout)
    assert "(mkdir -p ./experiment && mv ./my.yaml ./experiment/my.yaml)" in said, said
    move = re.search(r"\((mkdir [^)]*)\)", said).group(1)
    run = said.split("then: ", 1)[1]
    assert run == "runner-train --config-dir . experiment=my"
    subprocess.run(["bash", "-c", move], cwd=tmp_path, check=True)
    done = script(*run.split(), "dry_run=true", cwd=tmp_path)
    assert done.returncode == 0 and "Configuration is valid" in done.stdout, done.stderr


@pytest.mark.parametrize(
    "override, meant",
    [
        ("data.batch_size=64", "batch_size"),  # Hydra alone suggests +data.batch_size, which is refused next
        ("+data.batch_size=64", "batch_size"),
        ("optim.lrr=0.1", "optim.lr"),
        ("experimnet=quick", "experiment"),  # a group
        ("checkpoint.monitr=val_loss", "checkpoint.monitor"),
    ],
)
def test_a_misspelled_key_gets_the_closest_real_ones_and_no_dead_end(tmp_path, override, meant):
    proc = cli_in_process(override, "dry_run=true", cwd=tmp_path)
    said = paragraph(proc.stderr)
    assert proc.returncode == 2 and f"(did you mean {meant}" in said, said
    assert "+data.batch_size" not in said.replace(override, "") and "To append" not in said
    assert "Traceback" not in proc.stderr and not any(tmp_path.iterdir())


def test_a_misspelled_swept_key_is_refused_before_the_sweep_starts(tmp_path):
    proc = script("runner-train", "-m", "optim.lrr=0.1,0.2", f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)
    assert proc.returncode == 2 and "(did you mean optim.lr?)" in paragraph(proc.stderr), proc.stderr
    assert not (tmp_path / "s").exists()


def test_closest_keys_prefer_the_same_name_then_the_nearest_spelling():
    keys = ["batch_size", "epochs", "data.root", "data.image_size", "optim.lr", "optim.min_lr", "seed", "optim"]
    assert closest("data.batch_size", keys) == ["batch_size"]
    assert closest("optim.lrr", keys)[0] == "optim.lr" and closest("epoch", keys) == ["epochs"]
    assert closest("data.roott", keys) == ["data.root"] and closest("zzz", keys) == []
