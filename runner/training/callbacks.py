"""The order of the training callbacks, and the step clock that comes first among those reading the run state.

MindSpore calls a callback list in list order at every event (step begin/end, epoch begin/end, ...). The
callbacks share one RunState (runner/rundir/run_state.py) and never call each other, so within one event
a callback sees what the callbacks before it wrote: the order is the data flow. ORDER names each role
with the reason for its place (as MMEngine's hook priorities do), MUST_PRECEDE the pairs whose order
matters, and tests/test_callbacks.py checks a real Recipe's list against both.
"""

from typing import Dict, List, Sequence

from mindspore.train import Callback

from runner.rundir.run_state import RunState

ORDER = (
    ("profiler", "first: its window brackets the step as every other callback sees it"),
    ("clock", "sets the run state's step and epoch before any callback reads them"),
    ("timing", "keeps the step's outputs, which latest.json's curve and the train_loss score read at its end"),
    ("shapes", "records the batch's shape (a new one is a compile in graph mode)"),
    ("grad_stats", "checks the batch as the step begins (diagnose=on); the guard reads its verdict"),
    ("trace", "reads the step's loss, overflow and loss scale once, for loss_scale.csv and the guard"),
    ("guard", "stops training on a non-finite step before anything reads or saves that step"),
    ("validation", "records this epoch's validation before the checkpointer and the early stop read it"),
    ("checkpoint", "saves what passed the guard, ranked by this epoch's monitored value"),
    ("early_stop", "last: it requests the stop once this epoch's checkpoint (the best to restore) is saved"),
)
ROLES = tuple(name for name, _ in ORDER)

# (earlier, later, why): the pairs a reordering must not swap.
MUST_PRECEDE = (
    ("clock", "timing", "the step clock writes the step every later callback reads"),
    ("timing", "checkpoint", "a checkpoint saved at this step's end (a signal) holds this step's loss"),
    ("grad_stats", "guard", "the guard trips on the non-finite batch GradStats found"),
    ("trace", "guard", "the guard reads the loss and overflow the trace read"),
    ("guard", "validation", "a stopped run's pending validation is skipped"),
    ("guard", "checkpoint", "no checkpoint of a step the guard stopped on"),
    ("validation", "checkpoint", "the best checkpoint is chosen by this epoch's validation"),
    ("validation", "early_stop", "the early stop compares this epoch's validation"),
    ("checkpoint", "early_stop", "the checkpoint of the epoch that stops is saved before the stop"),
)


class StepClock(Callback):
    """Writes the run state's global step and epoch as each step and epoch begins."""

    def __init__(self, state: RunState):
        super().__init__()
        self.state = state

    def on_train_epoch_begin(self, run_context):
        self.state.epoch = int(run_context.original_args().cur_epoch_num)

    def on_train_step_begin(self, run_context):
        # MindSpore counts cur_step_num before the step begins, from 0 again in a resumed run.
        self.state.step = self.state.start_step + int(run_context.original_args().cur_step_num)


def order_problems(roles: Sequence[str]) -> List[str]:
    """What is wrong with a callback list's order (its roles, in list order): unknown or repeated roles, a
    role out of ORDER, a MUST_PRECEDE pair swapped. [] when the order holds."""
    problems = [f"unknown callback role {r!r} (not in ORDER)" for r in roles if r not in ROLES]
    problems += [f"{r!r} appears {roles.count(r)} times" for r in dict.fromkeys(roles) if roles.count(r) > 1]
    at = {r: i for i, r in enumerate(roles)}
    for earlier, later, why in MUST_PRECEDE:
        if earlier in at and later in at and at[earlier] > at[later]:
            problems.append(f"{earlier} must run before {later}: {why}")
    known = [r for r in roles if r in ROLES]
    if known != sorted(known, key=ROLES.index):
        problems.append(f"order {known} is not ORDER's {[r for r in ROLES if r in known]}")
    return problems


def in_order(by_role: Dict[str, Callback]) -> List[Callback]:
    """The callbacks (role -> callback; None where a role is off) as the list Model.fit runs, in ORDER."""
    unknown = set(by_role) - set(ROLES)
    if unknown:
        raise ValueError(f"callback roles {sorted(unknown)} are not in ORDER")
    return [by_role[r] for r in ROLES if by_role.get(r) is not None]
