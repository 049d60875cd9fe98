"""runner/training/callbacks.py: the order of the callback list Model.fit runs, and the run state they share."""

import pytest
from conftest import TINY, _process_state_restored, compose_cfg

from runner.training.callbacks import MUST_PRECEDE, ROLES, in_order, order_problems

# Every role switched on: the profiler, gradient statistics, validation every epoch and the early stop.
ALL_ROLES = ["profile.steps=1", "profile.start_step=2", "diagnose=on", "validation.every_epochs=1"]
ALL_ROLES += ["early_stop.patience=2", "checkpoint.monitor=val_loss"]


def role_of(callback) -> str:
    """The role of a callback by its class: the test's own map, not the recipe's dict."""
    from runner.amp.diagnose import GradStats
    from runner.amp.guard import LossScaleTrace, NanGuard
    from runner.report.monitor import RunMonitor
    from runner.report.profiling import ProfileWindow
    from runner.report.shapes import InputShapes
    from runner.training.callbacks import StepClock
    from runner.training.checkpoints import Checkpointer
    from runner.training.validation import EarlyStop, Validation

    roles = {
        ProfileWindow: "profiler",
        StepClock: "clock",
        RunMonitor: "timing",
        InputShapes: "shapes",
        GradStats: "grad_stats",
        LossScaleTrace: "trace",
        NanGuard: "guard",
        Validation: "validation",
        Checkpointer: "checkpoint",
        EarlyStop: "early_stop",
    }
    return roles[type(callback)]


def recipe_callbacks(run_dir, *overrides):
    """(the callback list a real tiny Recipe hands Model.fit, the recipe), built without training."""
    from runner.training.recipe import Recipe, environment

    cfg = compose_cfg(*TINY, *overrides)
    with _process_state_restored():
        recipe = Recipe(cfg, environment(cfg, str(run_dir)))
        recipe.setup()
        try:
            return recipe.callbacks(), recipe
        finally:
            recipe.cleanup()


def test_the_recipe_hands_model_fit_its_callbacks_in_order_sharing_one_state(tmp_path):
    callbacks, recipe = recipe_callbacks(tmp_path / "all", *ALL_ROLES)
    roles = [role_of(c) for c in callbacks]
    assert roles == list(ROLES) and order_problems(roles) == []
    # One run state: every callback that reads or writes it holds the recipe's (the profiler and the shape
    # record keep their own counts).
    shared = [role_of(c) for c in callbacks if getattr(c, "state", None) is recipe.state]
    assert shared == [r for r in ROLES if r not in ("profiler", "shapes")]


def test_roles_switched_off_leave_the_others_in_order():
    on = dict.fromkeys(ROLES, object())
    off = {**on, "profiler": None, "grad_stats": None, "early_stop": None}
    assert in_order(off) == [on[r] for r in ROLES if r not in ("profiler", "grad_stats", "early_stop")]


def swapped(roles, a, b):
    out = list(roles)
    i, j = out.index(a), out.index(b)
    out[i], out[j] = out[j], out[i]
    return out


@pytest.mark.parametrize(
    "a, b",
    [
        ("guard", "checkpoint"),
        ("validation", "checkpoint"),
        ("validation", "early_stop"),
        ("trace", "guard"),
        ("grad_stats", "guard"),
        ("clock", "timing"),
    ],
)
def test_a_broken_order_is_caught_with_its_reason(a, b):
    problems = order_problems(swapped(ROLES, a, b))
    why = next(w for x, y, w in MUST_PRECEDE if (x, y) == (a, b))
    assert f"{a} must run before {b}: {why}" in problems


def test_an_order_outside_order_or_an_unknown_role_is_caught():
    # Not a MUST_PRECEDE pair, still out of ORDER: the profiler after the clock no longer brackets the step.
    assert order_problems(swapped(ROLES, "profiler", "clock")) == [
        f"order {swapped(ROLES, 'profiler', 'clock')} is not ORDER's {list(ROLES)}"
    ]
    assert "unknown callback role 'mine' (not in ORDER)" in order_problems([*ROLES, "mine"])
    assert "'guard' appears 2 times" in order_problems([*ROLES, "guard"])
    with pytest.raises(ValueError, match="mine"):
        in_order({"mine": object()})
