"""build_model: the network the `model` settings name, sized for the data."""

from typing import Optional

from runner.models.conv import PATHS
from runner.models.errors import ModelError
from runner.models.resnet import resnet
from runner.models.zoo import mindcv_model


def build_model(cfg, num_classes: int, in_channels: int, image_size: int, conv: Optional[str] = None):
    """Build the network `cfg` (models.settings.ModelConfig) names for data of this shape.

    `conv` is model.conv as the caller resolved it (the runner decides `best` before MindSpore loads);
    None: cfg.conv, with `best` decided here.
    """
    if cfg.num_classes is not None and cfg.num_classes < num_classes:
        raise ModelError(
            f"The data has {num_classes} classes (labels 0..{num_classes - 1}) but model.num_classes="
            f"{cfg.num_classes}: labels outside the model's classes. "
            "Set model.num_classes=null to take it from the data."
        )
    conv = conv or getattr(cfg.conv, "value", cfg.conv)
    if cfg.style == "mindcv":
        if conv not in ("native", "best", "onednn"):  # a setting that would have no effect
            raise ModelError(
                f"model.conv={conv} applies to the runner's own ResNets (it needs each layer's input size); "
                "mindcv models take model.conv=best, onednn or native."
            )
        if conv == "best":  # per-layer timing needs each layer's input size, which a zoo model does not give
            from runner.models.conv import best_path

            conv = best_path()
        return mindcv_model(
            cfg.arch,
            cfg.num_classes or num_classes,
            in_channels,
            cfg.checkpoint,
            image_size,
            conv=conv,
            stem_pool=_value(cfg.stem_pool),
        )
    if conv not in PATHS:
        raise ModelError(f"model.conv must be one of {', '.join(PATHS)}, got {conv!r}.")
    try:
        return resnet(
            style=cfg.style,
            depth=cfg.depth,
            width=cfg.width,
            num_classes=cfg.num_classes or num_classes,
            in_channels=in_channels,
            image_size=image_size,
            conv=conv,
            stem=cfg.stem,
            stem_pool=_value(cfg.stem_pool),
            blocked_body=cfg.blocked_body,
            blocked_layers=_value(cfg.blocked_layers),
        )
    except ValueError as e:
        what = "model.stem_pool" if "stem_pool" in str(e) else "model.depth"
        raise ModelError(f"{what}: {e}.") from None


def _value(setting) -> str:
    """An enum setting's value, or the plain string a caller passed."""
    return str(getattr(setting, "value", setting))
