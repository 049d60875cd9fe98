"""Overrides as earlier releases documented them, as Hydra takes them now."""

from typing import List

# Groups whose slot conf/config.yaml's defaults list holds empty (`- experiment: null`): Hydra refuses
# `+experiment=x` next to that slot ("Multiple values for experiment"), the spelling earlier releases documented.
SLOTTED = ("experiment",)


def slotted(overrides: List[str]) -> List[str]:
    """overrides with `+experiment=x` as `experiment=x` (the train config's own defaults list holds the slot)."""
    return [_slotted(o) for o in overrides]


def _slotted(arg: str) -> str:
    for group in SLOTTED:
        if arg.startswith(f"+{group}="):
            return arg[1:]
    return arg
