"""Counts the input shapes training sees; each new one in graph/jit mode means another compile."""

import logging
from collections import Counter

from mindspore.train import Callback

log = logging.getLogger("runner")


class InputShapes(Callback):
    """Records the shape of every training batch's first input (the images) as the step begins.

    budget: how many shapes the padding option means to produce (1, or the bucket count); shapes
    beyond it, and compile counts above it, are logged as warnings.
    """

    def __init__(self, mode: str, budget: int = 1, padding: dict = None):
        """padding: the data's padding report (its kind and expected_batch_shapes name the warning's numbers)."""
        super().__init__()
        self.compiles = mode in ("graph", "jit")
        self.budget = budget
        self.padding = padding or {}
        self.counts = Counter()

    def on_train_step_begin(self, run_context):
        cb = run_context.original_args()
        element = cb.train_dataset_element
        if not element:  # sink mode hands the whole sink over at once; nothing per step to read
            return
        shape = tuple(int(d) for d in element[0].shape)
        if shape not in self.counts and self.counts and self.compiles:
            log.log(
                logging.WARNING if len(self.counts) >= self.budget else logging.INFO,
                "new input shape %s at step %d (seen before: %s): the graph compiles again. "
                "padding=fixed or padding=bucket keeps the shapes few.",
                shape,
                cb.cur_step_num,
                ", ".join(str(s) for s in self.counts),
            )
        self.counts[shape] += 1

    def metrics(self, compile_count: int) -> dict:
        """metrics.json entries; warns once more when the graph compiled more than once."""
        if compile_count > self.budget:
            expected = self.padding.get("expected_batch_shapes")
            if self.padding.get("kind") == "none":
                # padding=none plans no shape: the data's own sizes decide, as expected_batch_shapes counts.
                plan = f"padding=none keeps the data's sizes: {expected} batch shapes expected, 1 with padding=fixed"
            else:
                plan = f"the padding option plans {self.budget}; {expected} batch shapes expected"
            log.warning(
                "the training graph compiled %d times for %d distinct input shapes (%s); every compile costs "
                "a slow step (see metrics.json input_shapes and padding.expected_batch_shapes).",
                compile_count,
                len(self.counts),
                plan,
            )
        return {
            "distinct_input_shapes": len(self.counts),
            "input_shapes": {"x".join(map(str, s)): n for s, n in sorted(self.counts.items())},
        }


def compile_count(step_cell, mode: str, shapes: InputShapes) -> int:
    """Training-graph compiles: MindSpore's own record in graph mode, none in PyNative.

    The record is the train cell's compile_cache (docs/mindspore-notes.md#compile-per-shape).

    Under mode=jit MindSpore keeps its compiled phases inside the jit wrapper, out of reach; a jit
    function compiles once per distinct input shape, so that count stands in for it.
    """
    if mode == "graph":
        return len(getattr(step_cell, "compile_cache", ()))
    return len(shapes.counts) if mode == "jit" else 0
