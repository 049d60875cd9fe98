"""MindSpore input pipelines from plain settings (`datasets.settings`); usable without the runner.

Importing the package is cheap: MindSpore loads only when a pipeline is built, so a caller can set
the oneDNN environment first (docs/mindspore-notes.md#cpu-isa).
"""

from runner.datasets.errors import DataConfigError, DataError
from runner.datasets.settings import AugmentConfig, DataConfig, PaddingConfig

__all__ = [
    "build_data",
    "build_inputs",
    "Data",
    "AugmentConfig",
    "DataConfig",
    "PaddingConfig",
    "DataError",
    "DataConfigError",
]


def __getattr__(name):
    if name in ("build_data", "build_inputs", "Data"):
        from runner.datasets import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'datasets' has no attribute {name!r}")
