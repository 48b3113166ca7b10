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
* :class:`DownlinkCompression`: master compression of the broadcast, in one of two schemes
  (``scheme=``):

  - ``"aggregate"`` (default) is Algorithm 1 of the thesis (distributed SGD with bidirectional
    compression) as written: at the end of each round the master compresses the aggregate
    step ``Δ = x⁺ − x`` it just applied, ``C_M(Δ)``, sets its own model to ``x + C_M(Δ)`` and
    broadcasts ``C_M(Δ)`` at the next round; every node applies the same decoded step, so all
    share one ``x`` and nothing is remembered
    (:class:`~fedlightning.federated.downlink.AggregateDownlinkChannel`). Theorem 2.6.1 needs
    ``C_M`` unbiased, so a biased operator is refused. The initial model is sent once,
    dense, in the first round (counted); the compressed step waiting for the next broadcast is
    checkpointed with the server state, so a resumed run sends it, not the model again.
  - ``"replica"`` compresses the model against the clients' replica ``x̂``: it sends
    ``C(x − x̂)`` and both sides set ``x̂ ← x̂ + C(x − x̂)``, so the compression error is re-sent
    later instead of lost (the primal error feedback of EF21-P, Gruntkowska et al., arXiv
    2209.15218; also DoubleSqueeze-style server memory, arXiv 1905.05957). The replica starts from
    the initial model, sent once, dense, in the first round (counted)
    (:class:`~fedlightning.federated.downlink.ReplicaDownlinkChannel`).

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
from fedlightning.compression.sparse import TopK, TopKThen
from fedlightning.errors import ConfigError
from fedlightning.federated.channel import Channel
from fedlightning.federated.downlink import (
    AggregateDownlinkChannel,
    DownlinkScheme,
    ReplicaDownlinkChannel,
    check_scheme,
)
from fedlightning.federated.hooks import FederatedCallback

log = logging.getLogger(__name__)

__all__ = ["DownlinkCompression", "UplinkCompression"]


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
        self._refuse_a_top_k_that_keeps_everything(module, sizes)
        channel.attach(
            self.compressor, error_feedback=self.error_feedback, granularity=self.granularity, block_sizes=sizes
        )
        if self.log_metadata:
            log.debug("%s compression: %s", self.direction, channel.metadata(module.uplink_numel))

    def _refuse_a_top_k_that_keeps_everything(self, module: Any, sizes: list[int]) -> None:
        """Refuse a top-k whose ``k`` (or fraction) keeps every coordinate of every block it is applied to.

        Such an operator sends the whole payload plus its support, more bits than float32 for nothing.
        """
        top = self.compressor.top if isinstance(self.compressor, TopKThen) else self.compressor
        if not isinstance(top, TopK):
            return
        numel = getattr(module, "uplink_numel", None) if self.direction == "uplink" else None
        numel = int(numel) if numel is not None else sum(sizes)
        if numel <= 0:
            return
        layerwise = self.granularity == "layer" and len(sizes) > 1 and sum(sizes) == numel
        blocks = sizes if layerwise else [numel]
        if any(top.k_of(b) < b for b in blocks):
            return
        group = "compressor" if self.direction == "uplink" else "downlink"
        largest = max(blocks)
        where = f"the largest parameter tensor ({largest} entries)" if layerwise else f"the {largest}-entry payload"
        if top.k_fixed is not None:
            setting, fix = f"{group}.compressor.k={top.k_fixed}", f"set {group}.compressor.k below {largest}"
        else:
            setting, fix = f"{group}.compressor.fraction={top.fraction:g}", f"set {group}.compressor.fraction below 1"
        raise ConfigError(
            f"{setting} keeps every coordinate of {where}, so top-k compresses nothing and its message costs more "
            f"than float32; {fix}, or use {group}=none."
        )

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.attach(pl_module)


class UplinkCompression(_CompressionCallback):
    """Compress every client's upload; optional error feedback with per-client memory.

    Args:
        compressor: the operator (see :mod:`fedlightning.compression`).
        error_feedback: add and update the client's memory e_i (for biased operators).
        granularity: ``"layer"`` (per parameter tensor, default) or ``"model"``.
        log_metadata: log ω, δ and unbiasedness when attached (:func:`fedlightning.run.run` names the
            config choice; :func:`fedlightning.console.compressor_text`).
    """

    direction = "uplink"


class DownlinkCompression(_CompressionCallback):
    """Master compression of the broadcast (see the module docstring for the two schemes).

    Args:
        compressor: ``C_M``; unbiased for ``scheme="aggregate"`` (Algorithm 1).
        scheme: ``"aggregate"`` (Algorithm 1, the compressed aggregate step, no memory) or
            ``"replica"`` (``C(x − x̂)`` against the clients' replica).
        granularity: ``"layer"`` or ``"model"``.
        log_metadata: log ω, δ and unbiasedness when attached (:func:`fedlightning.run.run` names the
            config choice; :func:`fedlightning.console.compressor_text`).
    """

    direction = "downlink"

    def __init__(
        self,
        compressor: Compressor,
        *,
        scheme: DownlinkScheme = "aggregate",
        granularity: Literal["layer", "model"] = "layer",
        log_metadata: bool = True,
    ) -> None:
        super().__init__(compressor, granularity=granularity, log_metadata=log_metadata)
        check_scheme(scheme, compressor)
        self.scheme: DownlinkScheme = scheme

    def attach(self, module: Any) -> None:
        """Give the module the scheme's downlink channel, then put the operator on it."""
        from fedlightning.federated.module import FederatedModule

        old = module.downlink_channel
        cls = AggregateDownlinkChannel if self.scheme == "aggregate" else ReplicaDownlinkChannel
        if old.compressor is self.compressor:
            return
        old.check_payload(self.compressor)  # refused under either scheme: say so before naming the other
        if self.scheme == "aggregate" and isinstance(module, FederatedModule):
            own_state = (
                type(module).broadcast_state is not FederatedModule.broadcast_state
                or type(module).server_parameters is not FederatedModule.server_parameters
                or module.sets_server_state
            )
            if own_state and not old.per_client:
                raise ConfigError(
                    f"downlink.scheme=aggregate (Algorithm 1) compresses the step of the global model, but "
                    f"{old.method} broadcasts a state of its own; use downlink.scheme=replica."
                )
        if not isinstance(old, cls):
            module.downlink_channel = cls(
                payload=old.payload, codec=old.codec, method=old.method, per_client=old.per_client
            )
        super().attach(module)
