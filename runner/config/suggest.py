"""The settings closest to a misspelled one: "did you mean ..." for an override the configuration lacks."""

import difflib
from typing import Any, Dict, List

from runner.config.tree import flat

# Keys of the composed configuration that are no user's setting.
NOT_SETTINGS = ("hydra", "defaults")


def config_keys(body: Dict[Any, Any]) -> List[str]:
    """Every dotted key of a configuration (a plain mapping without `hydra`): its leaves and the nodes above them."""
    leaves = list(flat({str(k): v for k, v in body.items() if k not in NOT_SETTINGS}))
    nodes = {leaf.rsplit(".", i)[0] for leaf in leaves for i in range(1, leaf.count(".") + 1)}
    return sorted(set(leaves) | nodes)


def closest(key: str, keys: List[str], n: int = 3) -> List[str]:
    """Up to n real keys nearest to key, nearest first: the same last part anywhere (data.batch_size ->
    batch_size), else the nearest spellings of the whole key or of its last part (optim.lrr -> optim.lr)."""
    leaf, parent = key.rsplit(".", 1)[-1], key.rpartition(".")[0]

    def score(k: str) -> float:
        k_leaf, k_parent = k.rsplit(".", 1)[-1], k.rpartition(".")[0]
        if k_leaf == leaf:
            return 1.0
        near_leaf = difflib.SequenceMatcher(None, leaf, k_leaf).ratio() * (1.0 if k_parent == parent else 0.9)
        return max(difflib.SequenceMatcher(None, key, k).ratio(), near_leaf)

    scored = sorted(((score(k), k) for k in keys if k != key), key=lambda sk: (-sk[0], sk[1]))
    if not scored or scored[0][0] < 0.75:
        return []
    best = scored[0][0]
    return [k for s, k in scored if s >= max(0.75, best - 0.1)][:n]


def did_you_mean(key: str, keys: List[str]) -> str:
    """` (did you mean batch_size?)`-style text for key, empty when nothing is close."""
    near = closest(key, keys)
    if not near:
        return ""
    return f" (did you mean {' or '.join(near)}?)"
