"""The model layer's own error; the runner presents it as a one-paragraph message."""


class ModelError(Exception):
    """A model setting that cannot be built for this data (depth, classes, channels); the message names it."""
