"""Networks the runner can train; the public surface is build_model."""

from models.resnet import resnet


def build_model(cfg, num_classes: int, in_channels: int, image_size: int):
    """Build the network named by the `model` config group for this data."""
    return resnet(
        style=cfg.style.name,
        depth=cfg.depth,
        width=cfg.width,
        num_classes=cfg.num_classes or num_classes,
        in_channels=in_channels,
        image_size=image_size,
    )
