"""Compression callbacks: ``compressor=<name>`` (uplink) and ``downlink=<name>`` (broadcast).

Each callback attaches one operator to the module's channel of its direction
(:class:`fedlightning.federated.channel.Channel`) when the trainer is set up, that is before
any round runs. The channel refuses an operator whose accepted payloads do not include what
the method sends, with one sentence that names both, so an incompatible method × compressor
pair never trains.

* :class:`UplinkCompression`: every client's upload is compressed with the operator, drawing
  from ``module.generator(round_idx, client_id, "compress")``; with ``error_feedback=true`` the
  client's memory e_i is added before compressing and updated with what the operator dropped
  (thesis arXiv 2207.00392, Algorithm 4/6).
* :class:`DownlinkCompression`: the broadcast is compressed against the clients' replica
  (:class:`fedlightning.federated.channel.DownlinkChannel`).

``granularity="layer"`` applies the operator to each parameter tensor separately (the
thesis's and its authors' default: ω/δ of Rand-k/Top-k then refer to each tensor);
``"model"`` to the flattened vector. Methods read ω and δ from
``module.uplink_channel.metadata(d)``.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import lightning as L
from typing_extensions import override

from fedlightning.compression.operators import Compressor
from fedlightning.errors import ConfigError
from fedlightning.federated.channel import Channel, ReplicaCodec
from fedlightning.federated.hooks import FederatedCallback

log = logging.getLogger(__name__)

__all__ = ["DownlinkCompression", "ReplicaCodec", "UplinkCompression"]


class _CompressionCallback(FederatedCallback):
    direction: Literal["uplink", "downlink"] = "uplink"

    def __init__(
        self,
        compressor: Compressor,
        *,
        error_feedback: bool = False,
        granularity: Literal["layer", "model"] = "layer",
        log_metadata: bool = True,
    ) -> None:
        if not isinstance(compressor, Compressor):
            raise ConfigError(f"{self.direction} compressor must be a Compressor (got {type(compressor).__name__}).")
        if granularity not in {"layer", "model"}:
            raise ConfigError(f"compressor granularity must be 'layer' or 'model' (got {granularity!r}).")
        self.compressor = compressor
        self.error_feedback = bool(error_feedback)
        self.granularity: Literal["layer", "model"] = granularity
        self.log_metadata = log_metadata
        if self.direction == "uplink" and not compressor.unbiased and not self.error_feedback:
            log.warning(
                "Uplink compressor %s is biased and error feedback is off (compressor.error_feedback=false): "
                "distributed SGD may diverge (thesis Example 4.7.1).",
                compressor.name,
            )

    def channel(self, module: Any) -> Channel:
        """The module's channel of this direction."""
        return module.uplink_channel if self.direction == "uplink" else module.downlink_channel

    def attach(self, module: Any) -> None:
        """Put the operator on the module's channel (refused in one sentence if the payload does not fit)."""
        channel = self.channel(module)
        if channel.compressor is self.compressor:
            return  # already attached (a second fit of the same trainer)
        sizes = [p.numel() for p in module.server_parameters()] if hasattr(module, "server_parameters") else []
        channel.attach(
            self.compressor, error_feedback=self.error_feedback, granularity=self.granularity, block_sizes=sizes
        )
        if self.log_metadata:
            log.info("%s compression: %s", self.direction, channel.metadata(module.uplink_numel))

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.attach(pl_module)


class UplinkCompression(_CompressionCallback):
    """Compress every client's upload; optional error feedback with per-client memory.

    Args:
        compressor: the operator (see :mod:`fedlightning.compression`).
        error_feedback: add and update the client's memory e_i (for biased operators).
        granularity: ``"layer"`` (per parameter tensor, default) or ``"model"``.
        log_metadata: log ω, δ and unbiasedness when attached.
    """

    direction = "uplink"


class DownlinkCompression(_CompressionCallback):
    """Compress the broadcast against the clients' replica.

    Args:
        compressor: the operator for x − x̂ (unbiased ones keep the replica unbiased).
        granularity: ``"layer"`` or ``"model"``.
        log_metadata: log ω, δ and unbiasedness when attached.
    """

    direction = "downlink"

    def __init__(
        self, compressor: Compressor, *, granularity: Literal["layer", "model"] = "layer", log_metadata: bool = True
    ) -> None:
        super().__init__(compressor, granularity=granularity, log_metadata=log_metadata)
