"""Networks from plain settings (`models.settings`); usable without the runner.

Importing the package is cheap: MindSpore loads only when a network is built.
"""

from runner.models.errors import ModelError
from runner.models.settings import ModelConfig

__all__ = ["build_model", "ModelConfig", "ModelError"]


def __getattr__(name):
    if name == "build_model":
        from runner.models.build import build_model

        return build_model
    raise AttributeError(f"module 'models' has no attribute {name!r}")
