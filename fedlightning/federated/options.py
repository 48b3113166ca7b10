"""The engine's constructor options, checked before anything is built: one sentence per bad value."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from fedlightning.errors import ConfigError

__all__ = ["check_engine_options"]


def check_engine_options(
    *,
    method: str,
    local_epochs: int,
    local_steps: int | None,
    batch_size: int,
    max_grad_norm: float | None,
    aggregation: str,
    supported_aggregation: Sequence[str],
    sets_server_state: bool,
    has_server_optimizer: bool,
    model: nn.Module,
) -> None:
    """Refuse, naming its config key, an engine option that cannot be right (``FederatedModule``'s constructor).

    >>> options = dict(method="FedAvg", local_epochs=1, local_steps=None, batch_size=32, aggregation="normalised")
    >>> options |= dict(supported_aggregation=("normalised",), sets_server_state=False, has_server_optimizer=True)
    >>> check_engine_options(**options, max_grad_norm=1.0, model=nn.Linear(2, 2))
    >>> check_engine_options(**options, max_grad_norm=-1.0, model=nn.Linear(2, 2))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedlightning.errors.ConfigError: method.max_grad_norm must be a positive finite number or null (got -1.0); ...
    """
    if local_epochs < 1:
        raise ConfigError(f"method.local_epochs must be at least 1 (got {local_epochs}).")
    if local_steps is not None and local_steps < 1:
        raise ConfigError(f"method.local_steps must be at least 1 or null (got {local_steps}).")
    if batch_size < 1:
        raise ConfigError(f"method.batch_size must be at least 1 (got {batch_size}).")
    clip_ok = isinstance(max_grad_norm, int | float) and not isinstance(max_grad_norm, bool)
    if max_grad_norm is not None and not (clip_ok and 0 < max_grad_norm < math.inf):
        raise ConfigError(
            f"method.max_grad_norm must be a positive finite number or null (got {max_grad_norm!r}); "
            "e.g. method.max_grad_norm=1.0, or null for no clipping."
        )
    if aggregation not in supported_aggregation:
        raise ConfigError(
            f"{method} supports method.aggregation={' or '.join(supported_aggregation)} (got {aggregation!r})."
        )
    if sets_server_state and has_server_optimizer:
        raise ConfigError(
            f"{method} sets its server state from the uploads and has no server optimiser; "
            "remove method.server_optimizer."
        )
    if any(True for _ in model.buffers()):
        raise ConfigError(
            "The model has buffers (e.g. BatchNorm running statistics) that federated averaging "
            "does not aggregate; use a model with GroupNorm or no normalisation."
        )
