"""The data layer's own errors; the runner presents them as one-paragraph messages."""


class DataError(Exception):
    """A data problem: missing path, empty folder, unreadable file, bad labels; the message names it."""


class DataConfigError(DataError):
    """Data or padding settings that cannot work (out of range, contradictory)."""
