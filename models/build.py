"""build_model: the network the `model` settings name, sized for the data."""

from models.errors import ModelError
from models.resnet import resnet


def build_model(cfg, num_classes: int, in_channels: int, image_size: int):
    """Build the network `cfg` (models.settings.ModelConfig) names for data of this shape."""
    if cfg.num_classes is not None and cfg.num_classes < num_classes:
        raise ModelError(
            f"The data has {num_classes} classes (labels 0..{num_classes - 1}) but model.num_classes="
            f"{cfg.num_classes}: labels outside the model's classes. "
            "Set model.num_classes=null to take it from the data."
        )
    try:
        return resnet(
            style=cfg.style,
            depth=cfg.depth,
            width=cfg.width,
            num_classes=cfg.num_classes or num_classes,
            in_channels=in_channels,
            image_size=image_size,
        )
    except ValueError as e:
        raise ModelError(f"model.depth: {e}.") from None
