"""Errors that end a run with one sentence naming the problem and the fix."""


class FedLightningError(Exception):
    """Base class: the message is one sentence for the user, printed without a traceback."""


class ConfigError(FedLightningError, ValueError):
    """A configuration value is invalid; the message names the key and a valid choice."""


class NonFiniteLossError(FedLightningError, FloatingPointError):
    """Local training produced a NaN or infinite loss or update."""


class MessageDecodeError(FedLightningError, ValueError):
    """A message's bytes are not a valid stream of its codec; the message names the codec and the fault."""


class UnreadableStateError(FedLightningError, RuntimeError):
    """A spilled client-state file is not what the run wrote (damaged, or not only tensors and plain containers)."""
