"""Errors a user can fix: the CLI prints their message as one paragraph and exits 2, no traceback."""


class UserError(Exception):
    """A mistake in the configuration, the data or the environment; the message names the culprit."""


class ConfigError(UserError):
    """A configuration value that composes but cannot be run (out of range, contradictory)."""


class DataError(UserError):
    """A data problem: missing path, empty folder, unreadable file, bad labels."""
