"""`amp.keep_fp32`: cells that stay FP32 under O1/O2/O3, with their inputs kept FP32 up to them.

Why not just `cell.to_float(float32)`: under O2/O3 `auto_mixed_precision` calls `to_float(float16)` on
the whole network, so the *root* cell casts its inputs to FP16 at its entry (graph mode inserts
that cast where the root's construct reads its arguments; PyNative sets the root's precision while
it runs). An input above 65504 is already `inf` when it reaches a stem that is FP32 itself
(docs/mindspore-notes.md#fp16-input-cast). So for every kept cell we also mark each of its
*ancestors* FP32, one cell at a time (`Cell.add_flags`, not the recursive `to_float`): an ancestor
then passes its inputs on in FP32, while each of its other children keeps its own FP16 flag and
casts at its own entry. The FP16 part therefore starts at the boundary of the first FP16 cell after
the island, and the island's output is cast to FP16 by the next FP16 cell that reads it. All of
this uses MindSpore's own cell precision flags: no source rewriting and no strings evaluated.

Under O1 (white-list casts inserted by MindSpore's rewrite) nothing casts at the entry; a cell whose
precision the user set before `auto_mixed_precision` is skipped by the rewrite, so we mark the
kept cells before it runs.
"""

from fnmatch import fnmatchcase

from mindspore import dtype as mstype

from runner.errors import ConfigError


def cell_names(net) -> dict:
    """id(cell) -> dotted name, as `cells_and_names()` gives them on the network the user configured."""
    return {id(cell): name for name, cell in net.cells_and_names() if name}


def match_cells(net, patterns, option: str = "amp.keep_fp32") -> list:
    """(name, cell) for the cells the patterns select, outermost only, in definition order.

    A pattern selects a cell whose dotted name equals it, starts with it followed by a dot (a prefix:
    `layer1` keeps all of layer1) or matches it as a shell glob (`layer*.0.conv1`). `option` names the
    setting in the error for a pattern that selects nothing.
    """
    named = [(name, cell) for name, cell in net.cells_and_names() if name]
    chosen, unmatched = [], []
    for pattern in patterns:
        hits = [(n, c) for n, c in named if n == pattern or n.startswith(pattern + ".") or fnmatchcase(n, pattern)]
        if not hits:
            unmatched.append(pattern)
        chosen += [h for h in hits if h not in chosen]
    if unmatched:
        top = sorted({n.split(".")[0] for n, _ in named})
        raise ConfigError(
            f"{option} names no cell: {unmatched}. Cell names are dotted paths from the network's "
            f"attributes, e.g. {top[:8]} and below them (layer1.0.conv1); glob patterns work too."
        )
    # A cell inside another kept cell is already FP32 through its parent's recursive to_float.
    names = [n for n, _ in chosen]
    return [(n, c) for n, c in chosen if not any(n.startswith(p + ".") for p in names if p != n)]


def _path_to(root, target):
    """Cells from root down to target (both included), found by identity; None if target is not below."""
    if root is target:
        return [root]
    for child in root.name_cells().values():
        if child is root:
            continue
        path = _path_to(child, target)
        if path:
            return [root] + path
    return None


def keep_fp32(amp_net, cells) -> list:
    """Make each cell FP32 and every cell on the way to it from amp_net pass FP32 inputs through.

    Returns the ancestors that were re-flagged (for tests and the log). Call it on the network that
    `auto_mixed_precision` returned; it is safe to call again with more cells.
    """
    touched = []
    for cell in cells:
        cell.to_float(mstype.float32)
        path = _path_to(amp_net, cell)
        if path is None:
            raise ConfigError(f"amp.keep_fp32: {type(cell).__name__} is not part of the network being trained.")
        for ancestor in path[:-1]:
            # Non-recursive on purpose: the ancestor's other children keep casting to FP16.
            ancestor.add_flags(fp16=False, bf16=False, fp32=True)
            if all(a is not ancestor for a in touched):
                touched.append(ancestor)
    return touched
