"""Networks the runner can train; the public surface is build_model."""

from models.resnet import resnet
from models.zoo import ModelSourceError, mindcv_model
from runner.errors import DataError


def build_model(cfg, num_classes: int, in_channels: int, image_size: int):
    """Build the network named by the `model` config group for this data."""
    if cfg.num_classes is not None and cfg.num_classes < num_classes:
        raise DataError(
            f"The data has {num_classes} classes (labels 0..{num_classes - 1}) but model.num_classes="
            f"{cfg.num_classes}: labels outside the model's classes. "
            "Set model.num_classes=null to take it from the data."
        )
    style = cfg.style.name
    if style == "mindcv":
        return mindcv_model(cfg.arch, cfg.num_classes or num_classes, in_channels, cfg.checkpoint)
    return resnet(
        style=style,
        depth=cfg.depth,
        width=cfg.width,
        num_classes=cfg.num_classes or num_classes,
        in_channels=in_channels,
        image_size=image_size,
        stem=cfg.stem.name,
    )


__all__ = ["build_model", "ModelSourceError"]
