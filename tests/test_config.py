"""Composition: every option of every group composes; typos fail before MindSpore loads."""

import re
import subprocess
import sys

import pytest
from conftest import REPO, cli_in_process, compose_cfg
from omegaconf import OmegaConf

from runner.config.checks import validate

GROUPS = sorted(
    p.name for p in (REPO / "conf").iterdir() if p.is_dir() and p.name not in ("experiment", "hydra", "__pycache__")
)
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((REPO / "conf" / g).glob("*.yaml"))]
ADDED = {"ladder"}  # groups outside the defaults list: composed with `+group=option`


@pytest.mark.parametrize("group,option", OPTIONS)
@pytest.mark.slow
def test_every_option_composes(group, option):
    extra = ["data.root=/tmp"] if group == "data" and option != "digits" and option != "synthetic" else []
    extra += ["experiment=ladder"] if group == "ladder" else []  # the rungs read the ladder's batch sizes
    cfg = compose_cfg(*[f"{'+' if group in ADDED else ''}{group}={option}", *extra])
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # nothing left MISSING
    validate(cfg)  # and every shipped option passes the runner's own checks


def test_every_experiment_composes():
    for f in sorted((REPO / "conf" / "experiment").glob("*.yaml")):
        # The recipes need the user's data (and weights to fine-tune): test_recipes.py dry-runs them with it.
        extra = [] if f.stem in ("quick", "ladder") else ["data.root=/tmp"]
        extra += [f"model.checkpoint={REPO / 'pyproject.toml'}"] if f.stem == "finetune_mindcv" else []
        cfg = compose_cfg(*[f"experiment={f.stem}", *extra])
        assert cfg.experiment_name == f.stem
        validate(cfg)


TYPOS = [
    ("amp=o5", "Could not find 'amp/o5'"),
    ("mode=grpah", "Could not find 'mode/grpah'"),
    ("sink.sink_sise=4", "sink_sise"),
    ("batch_size=abc", "could not be converted to Integer"),
    ("amp.level=O7", "Invalid value 'O7'"),
    ("amp.dtype=fp8", "Invalid value 'fp8'"),
]


@pytest.mark.parametrize("override,message", TYPOS)
def test_typos_are_one_clear_error(override, message):
    proc = cli_in_process(override)
    assert proc.returncode == 2  # a mistake in the configuration, Hydra's own composition errors included
    assert message in " ".join(proc.stderr.split())  # one paragraph, wrapped
    assert "Traceback" not in proc.stderr


def test_typos_fail_before_mindspore_loads():
    # One interpreter runs the CLI on each typo in turn (a fresh process: this one has MindSpore loaded).
    code = (
        "import sys\n"
        "from hydra.core.global_hydra import GlobalHydra\n"
        "from runner.__main__ import train\n"
        "for override in sys.argv[1:]:\n"
        "    sys.argv = ['runner', override]\n"
        "    try:\n"
        "        train()\n"
        "    except SystemExit as e:\n"
        "        print('exit', e.code, flush=True)\n"
        "    GlobalHydra.instance().clear()\n"
        "print('mindspore loaded:', sorted({m.split('.')[0] for m in sys.modules} & {'mindspore'}))\n"
    )
    typos = [override for override, _ in TYPOS]
    proc = subprocess.run([sys.executable, "-c", code, *typos], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split("\n")[:-1] == ["exit 2"] * len(typos) + ["mindspore loaded: []"], proc.stdout + proc.stderr


def test_help_lists_groups_and_options():
    proc = cli_in_process("--help")
    assert proc.returncode == 0
    # The app's own help: one line per group a user selects (ladder's rungs are internal), its options listed.
    for group, option in OPTIONS:
        if group == "ladder":
            continue
        assert re.search(rf"^  {group} ", proc.stdout, re.M) and option in proc.stdout, (group, option)


def test_cfg_job_prints_the_composed_config():
    proc = cli_in_process("--cfg", "job", "amp=o2", "mode=pynative")
    assert proc.returncode == 0
    cfg = OmegaConf.create(proc.stdout)
    assert cfg.amp.level == "O2" and cfg.mode.name == "pynative"


def test_cfg_hydra_resolve_prints_the_hydra_node_as_the_run_sees_it():
    # Hydra resolves the hydra node without the rest of the config: ${experiment_name} was its traceback.
    proc = cli_in_process("--cfg", "hydra", "--resolve", "experiment_name=lr_test")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    hydra = OmegaConf.create(proc.stdout).hydra
    assert hydra.run.dir.startswith("outputs/") and hydra.run.dir.endswith("_lr_test"), hydra.run.dir
    assert "${" not in hydra.run.dir and hydra.job.name == "runner"


def test_one_walk_over_a_config_tree():
    from runner.config.tree import flat, walk

    tree = {"a": {"b": 1, "c": [{"_target_": "x.y"}]}, "d": {}, "e": None}
    assert [(p, k) for p, k, _ in walk(tree)] == [
        ("a", "a"),
        ("a.b", "b"),
        ("a.c", "c"),
        ("a.c[0]", 0),
        ("a.c[0]._target_", "_target_"),
        ("d", "d"),
        ("e", "e"),
    ]
    # A list is one setting; an empty section stays visible, so a resume that adds keys to it is a change.
    assert flat(tree) == {"a.b": 1, "a.c": [{"_target_": "x.y"}], "d": {}, "e": None}
