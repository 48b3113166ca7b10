"""Errors that end a run with one sentence naming the problem and the fix."""


class FedLightningError(Exception):
    """Base class: the message is one sentence for the user, printed without a traceback."""


class ConfigError(FedLightningError, ValueError):
    """A configuration value is invalid; the message names the key and a valid choice."""


class NonFiniteLossError(FedLightningError, FloatingPointError):
    """Local training produced a NaN or infinite loss or update."""
