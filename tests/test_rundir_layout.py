"""The run directory's one reader of latest.json: every way it can be broken is one clear problem."""

import json
import re

import pytest

from runner.errors import ConfigError
from runner.rundir.layout import RunDir, StateProblem, read_state


def _run(tmp_path, state, files=("step_00000010.ckpt",)):
    run = RunDir(str(tmp_path))
    (tmp_path / "checkpoints").mkdir()
    for name in files:
        (tmp_path / "checkpoints" / name).write_bytes(b"x")
    (tmp_path / "checkpoints" / "latest.json").write_text(state if isinstance(state, str) else json.dumps(state))
    return run


GOOD = {"latest": "step_00000010.ckpt", "global_step": 10, "best": {"file": "step_00000010.ckpt"}}


@pytest.mark.parametrize(
    "state, problem",
    [
        ('{"latest": "step_000', "unreadable (JSONDecodeError"),  # truncated by a crash
        ("", "unreadable (JSONDecodeError"),
        ("[1, 2]", "a JSON list, not an object"),
        ({"global_step": 10}, "unreadable (KeyError"),
        ({"latest": "step_00000010.ckpt", "global_step": "ten"}, "unreadable (ValueError"),
        ({**GOOD, "best": "step_00000010.ckpt"}, "its best record is not an object"),
        ({**GOOD, "latest": "../step_00000010.ckpt"}, "are not file names"),
        ({**GOOD, "latest": "step_00000020.ckpt"}, "names step_00000020.ckpt, which is missing"),
    ],
)
def test_a_broken_latest_json_is_one_problem_for_resume_ckpt_and_init_from(tmp_path, state, problem):
    from runner.rundir.saved_run import checkpoint_path, source_path

    run = _run(tmp_path, state)
    with pytest.raises(StateProblem, match=re.escape(problem)):
        read_state(run.checkpoints)
    for ckpt in ("last", "best"):
        with pytest.raises(ConfigError, match=f"ckpt={ckpt}: .*latest.json") as e:
            checkpoint_path(run.path, ckpt)
        assert "checkpoints/step_00000010.ckpt" in str(e.value)  # what the run does have
    with pytest.raises(ConfigError, match=f"init_from={run.path}: .*latest.json"):
        source_path(run.path)


def test_an_intact_latest_json_names_the_latest_and_the_best(tmp_path):
    from runner.rundir.saved_run import checkpoint_path, source_path

    state = {**GOOD, "latest": "step_00000020.ckpt", "global_step": 20}
    run = _run(tmp_path, state, files=("step_00000010.ckpt", "step_00000020.ckpt"))
    assert read_state(run.checkpoints)["path"] == run.checkpoint("step_00000020.ckpt")
    assert checkpoint_path(run.path, "last") == run.checkpoint("step_00000020.ckpt")
    assert checkpoint_path(run.path, "best") == run.checkpoint("step_00000010.ckpt")
    assert source_path(run.path) == run.checkpoint("step_00000010.ckpt")  # no model.ckpt: the best
