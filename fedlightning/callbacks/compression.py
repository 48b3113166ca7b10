"""Compression callbacks: ``compressor=<name>`` (uplink) and ``downlink=<name>`` (broadcast).

:class:`UplinkCompression` implements ``encode_uplink``: every client's upload is compressed
with the configured operator, drawing its randomness from
``module.generator(round_idx, client_id, "compress")``. With ``error_feedback=true`` the
client's memory (``module.client_state[client_id]["ef_memory"]``) is added before compressing
and updated with what the compressor dropped (thesis Algorithm 4/6).

:class:`DownlinkCompression` implements ``encode_downlink``. The server keeps the clients'
replica ``x̂`` of the broadcast state (in ``module.client_state`` under the server id, so it
is checkpointed), sends ``C(x − x̂)`` and both sides set ``x̂ ← x̂ + C(x − x̂)``; the
decoded message is the new replica. The compression error is therefore re-sent in the next
round instead of accumulating (the replica plays the role of the master-side memory). The
replica starts at zero, so round 0 compresses the initial state itself. With full
participation every client holds the replica; with partial participation it models a
broadcast channel that all clients listen to (the accountant charges each cohort member).

``granularity="layer"`` applies the operator to each parameter tensor separately (the
thesis's and the authors' default: ω/δ of Rand-k/Top-k then refer to each tensor);
``"model"`` to the flattened model.

Methods read the operator's metadata through :func:`uplink_compressor` (ω, δ for step sizes
and DIANA's shift rate), so changing ``compressor=`` changes those rules consistently.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from torch import Tensor

from fedlightning.compression.error_feedback import MEMORY_KEY, error_feedback_step
from fedlightning.compression.operators import Blockwise, Compressor, Identity
from fedlightning.errors import ConfigError
from fedlightning.federated.hooks import FederatedCallback
from fedlightning.federated.message import Message
from fedlightning.federated.rng import SERVER

log = logging.getLogger(__name__)

__all__ = ["DownlinkCompression", "ReplicaCodec", "UplinkCompression", "uplink_compressor"]

REPLICA_KEY = "downlink_replica"


class _CompressionCallback(FederatedCallback):
    direction = "uplink"

    def __init__(self, compressor: Compressor, *, granularity: str = "layer", log_metadata: bool = True) -> None:
        if not isinstance(compressor, Compressor):
            raise ConfigError(f"{self.direction} compressor must be a Compressor (got {type(compressor).__name__}).")
        if granularity not in {"layer", "model"}:
            raise ConfigError(f"compressor granularity must be 'layer' or 'model' (got {granularity!r}).")
        self.compressor = compressor
        self.granularity = granularity
        self.log_metadata = log_metadata
        self._operator: Compressor | None = None
        self._operator_dim = -1

    def operator(self, module: Any, numel: int | None = None) -> Compressor:
        """The operator applied to a flat vector of ``numel`` entries (layer-wise if it matches the model)."""
        sizes = [p.numel() for p in module.server_parameters()] if hasattr(module, "server_parameters") else []
        numel = sum(sizes) if numel is None else numel
        if self._operator is None or self._operator_dim != numel:
            if self.granularity == "layer" and sizes and sum(sizes) == numel and len(sizes) > 1:
                self._operator = Blockwise(self.compressor, sizes)
            else:
                self._operator = self.compressor
            self._operator_dim = numel
        return self._operator

    def metadata(self, module: Any) -> dict[str, Any]:
        """ω, δ and unbiasedness of the operator as applied to this model."""
        op = self.operator(module)
        return op.metadata(self._operator_dim)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.log_metadata:
            meta = self.metadata(pl_module)
            log.info("%s compression: %s", self.direction, meta)


class UplinkCompression(_CompressionCallback):
    """Compress every client's upload; optional error feedback with per-client memory.

    Args:
        compressor: the operator (see :mod:`fedlightning.compression`).
        error_feedback: add and update the client's memory ``e_i`` (for biased operators).
        granularity: ``"layer"`` (per parameter tensor, default) or ``"model"``.
    """

    direction = "uplink"

    def __init__(
        self,
        compressor: Compressor,
        *,
        error_feedback: bool = False,
        granularity: str = "layer",
        log_metadata: bool = True,
    ) -> None:
        super().__init__(compressor, granularity=granularity, log_metadata=log_metadata)
        self.error_feedback = bool(error_feedback)
        if not compressor.unbiased and not self.error_feedback:
            log.warning(
                "Uplink compressor %s is biased and error feedback is off (compressor.error_feedback=false): "
                "distributed SGD may diverge (thesis Example 4.7.1).",
                compressor.name,
            )

    def encode_uplink(self, trainer: L.Trainer, module: Any, round_idx: int, client_id: int, upload: Tensor) -> Message:
        op = self.operator(module, upload.numel())
        gen = module.generator(round_idx, client_id, "compress")
        if not self.error_feedback:
            return op.compress(upload, gen)
        memory = module.client_state.get(client_id, MEMORY_KEY)
        if memory is None:
            memory = torch.zeros_like(upload)
        message, new_memory = error_feedback_step(op, upload, memory, gen)
        module.client_state.set(client_id, MEMORY_KEY, new_memory)
        return message


class ReplicaCodec:
    """Decodes a downlink message as ``reference + C(x − reference)``."""

    def __init__(self, compressor: Compressor, reference: Tensor) -> None:
        self.compressor = compressor
        self.reference = reference
        self.name = f"replica[{compressor.name}]"

    def encode(self, x: Tensor) -> Message:  # pragma: no cover - messages are built by the callback
        raise NotImplementedError("ReplicaCodec only decodes; DownlinkCompression encodes.")

    def decode(self, message: Message) -> Tensor:
        inner = Message(payload=message.payload, num_bits=message.num_bits, codec=self.compressor, shape=message.shape)
        return self.reference.reshape(message.shape) + self.compressor.decode(inner)


class DownlinkCompression(_CompressionCallback):
    """Compress the broadcast against the clients' replica (see the module docstring).

    Args:
        compressor: the operator for ``x − x̂`` (unbiased ones keep the replica unbiased).
        granularity: ``"layer"`` or ``"model"``.
    """

    direction = "downlink"

    def encode_downlink(self, trainer: L.Trainer, module: Any, round_idx: int, state: Tensor) -> Message:
        op = self.operator(module, state.numel())
        replica = module.client_state.get(SERVER, REPLICA_KEY)
        if replica is None or replica.numel() != state.numel():
            replica = torch.zeros_like(state)
        replica = replica.to(state.device)
        inner = op.compress(state - replica, module.generator(round_idx, SERVER, "compress_downlink"))
        message = Message(
            payload=inner.payload,
            num_bits=inner.num_bits,
            codec=ReplicaCodec(op, replica.detach().clone()),
            shape=inner.shape,
            header_bits=inner.header_bits,
        )
        module.client_state.set(SERVER, REPLICA_KEY, message.decode().to(state.device))
        return message


def uplink_compressor(module: Any) -> tuple[Compressor, int]:
    """The uplink operator as applied to ``module``'s model and its dimension.

    Returns ``(Identity(), d)`` when no ``compressor=`` is configured.
    """
    d = sum(p.numel() for p in module.server_parameters())
    trainer = getattr(module, "_trainer", None)
    if trainer is not None:
        for cb in trainer.callbacks:
            if isinstance(cb, UplinkCompression):
                return cb.operator(module, d), d
    return Identity(), d
