"""The broadcast's two compression schemes as channels (thesis arXiv 2207.00392, Algorithm 1; EF21-P).

:class:`AggregateDownlinkChannel` is Algorithm 1's master compression of the aggregate step;
:class:`ReplicaDownlinkChannel` compresses the model against the clients' replica. Both keep what
they need in the checkpointed client state store, under the server's id. The callback that puts
them on a module is :class:`fedlightning.callbacks.compression.DownlinkCompression`; the channels
import no Lightning, so the pre-flight (:mod:`fedlightning.preflight`) builds them to check a
method × ``downlink=`` pair before any data is read.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor

from fedlightning.errors import ConfigError
from fedlightning.federated.channel import DownlinkChannel, ReplicaCodec
from fedlightning.federated.message import Message
from fedlightning.federated.operator import Operator
from fedlightning.federated.params import assign_flat_, flat_parameters
from fedlightning.federated.rng import SERVER

if TYPE_CHECKING:
    from fedlightning.federated.state import ClientStateStore

log = logging.getLogger(__name__)

__all__ = [
    "PENDING_KEY",
    "REPLICA_KEY",
    "SHARED_KEY",
    "AggregateDownlinkChannel",
    "DownlinkScheme",
    "ReplicaDownlinkChannel",
    "check_scheme",
    "pending_message",
    "pending_state",
]

SHARED_KEY = "downlink_shared_x"
"""The model every node holds under Algorithm 1 (server entry of the client state store)."""
PENDING_KEY = "downlink_pending_step"
"""Algorithm 1's compressed step C_M(Δ) not yet broadcast: its bitstream (server entry)."""
REPLICA_KEY = "downlink_replica"
"""The clients' replica x̂ of the replica scheme (server entry of the client state store)."""
DownlinkScheme = Literal["aggregate", "replica"]


def check_scheme(scheme: str, operator: Operator) -> None:
    """Refuse an unknown scheme, and a biased operator under ``"aggregate"`` (Theorem 2.6.1 needs ``C_M`` unbiased).

    >>> from fedlightning.compression import RandK, TopK
    >>> check_scheme("aggregate", RandK(fraction=0.1))
    >>> check_scheme("aggregate", TopK(fraction=0.1))
    Traceback (most recent call last):
    ...
    fedlightning.errors.ConfigError: downlink.scheme=aggregate (Algorithm 1) needs an unbiased master compressor ...
    """
    if scheme not in ("aggregate", "replica"):
        raise ConfigError(f"downlink.scheme must be 'aggregate' (Algorithm 1) or 'replica' (got {scheme!r}).")
    if scheme == "aggregate" and not operator.unbiased:
        raise ConfigError(
            f"downlink.scheme=aggregate (Algorithm 1) needs an unbiased master compressor and {operator.name} "
            "is biased; use downlink.scheme=replica, which re-sends what it drops."
        )


class ReplicaDownlinkChannel(DownlinkChannel):
    """The replica scheme: ``C(x − x̂)``, ``x̂ ← x̂ + C(x − x̂)``; x̂ starts as the initial model, sent dense."""

    scheme = "replica"

    def send(
        self, x: Tensor, *, client_id: int = SERVER, generator: torch.Generator | None, state: ClientStateStore
    ) -> tuple[Message, Tensor]:
        if self.compressor is None:
            return super().send(x, client_id=client_id, generator=generator, state=state)
        if generator is None:
            raise ValueError(f"The downlink operator {self.compressor.name} needs the server's random stream.")
        replica = state.get(SERVER, REPLICA_KEY)
        if replica is None or replica.numel() != x.numel():  # first round: the initial model, once, dense
            message = self.codec.encode(x)
            decoded = message.decode()
        else:
            op = self.operator(x.numel())
            replica = replica.to(x.device)
            message = ReplicaCodec.wrap(op.compress(x - replica, generator), op, replica)
            decoded = message.decode()
        state.set(SERVER, REPLICA_KEY, decoded.to(x.device, copy=True))
        return message, decoded


class AggregateDownlinkChannel(DownlinkChannel):
    """Algorithm 1's master compression: the compressed aggregate step, no memory, one shared x.

    :meth:`after_server_step` compresses the step the server optimiser just took against the
    model every node holds, ``C_M(x⁺ − x)``, moves the server model to ``x + C_M(x⁺ − x)`` and
    keeps that message's bitstream as server state; :meth:`send` broadcasts it in the next
    round. Both live in the checkpointed client state store, so a resumed run sends exactly the
    message the uninterrupted run sends. The first broadcast sends the model itself with the
    method's codec; a round without a server step sends the operator's code of a zero step.
    """

    scheme = "aggregate"

    def send(
        self, x: Tensor, *, client_id: int = SERVER, generator: torch.Generator | None, state: ClientStateStore
    ) -> tuple[Message, Tensor]:
        if self.compressor is None:
            return super().send(x, client_id=client_id, generator=generator, state=state)
        op = self.operator(x.numel())
        held = state.get(SERVER, SHARED_KEY)
        held = None if held is None else held.to(x.device)
        pending = state.get(SERVER, PENDING_KEY)
        message: Message | None = None
        if held is not None and pending is not None:
            message = ReplicaCodec.wrap(pending_message(pending, op, tuple(x.shape)), op, held)
            decoded = message.decode().to(x.device, x.dtype)
            if not torch.equal(decoded, x):  # the model moved since the step was compressed: send it whole
                log.warning("The server model is not the compressed step's result; the downlink sends it dense.")
                message = None
        elif held is not None and torch.equal(held, x):
            # a round without a server step: the clients hold x already; the operator sends a zero step
            message = ReplicaCodec.wrap(op.compress(torch.zeros_like(x), generator), op, x)
        if message is None:  # the first round: the model itself, once
            message = self.codec.encode(x)
        decoded = message.decode()
        state.set(SERVER, PENDING_KEY, None)
        state.set(SERVER, SHARED_KEY, decoded.to(x.device, copy=True))
        return message, decoded

    def after_server_step(self, module: Any, round_idx: int) -> None:
        """Compress the server's step Δ = x⁺ − x to C_M(Δ) and move the server model to x + C_M(Δ)."""
        if self.compressor is None:
            return
        held = module.client_state.get(SERVER, SHARED_KEY)
        if held is None:
            return
        x_new = flat_parameters(module.model)
        held = held.to(x_new.device)
        op = self.operator(x_new.numel())
        inner = op.compress(x_new - held, module.generator(round_idx, SERVER, "compress_downlink"))
        decoded = ReplicaCodec.wrap(inner, op, held).decode().to(x_new.device, x_new.dtype)
        assign_flat_(module.model, decoded)
        module.client_state.set(SERVER, PENDING_KEY, pending_state(inner))


def pending_state(message: Message) -> dict[str, Tensor]:
    """A message's bitstream as tensors for the client state store (its payload bytes, bits and header bits)."""
    return {
        "payload": torch.from_numpy(np.frombuffer(message.payload, dtype=np.uint8).copy()),
        "bits": torch.tensor([message.num_bits, message.header_bits], dtype=torch.int64),
    }


def pending_message(state: dict[str, Tensor], codec: Operator, shape: tuple[int, ...]) -> Message:
    """The message :func:`pending_state` stored, read by ``codec``."""
    bits = state["bits"].tolist()
    return Message(
        payload=bytes(state["payload"].cpu().numpy().tobytes()),
        num_bits=int(bits[0]),
        codec=codec,
        shape=shape,
        header_bits=int(bits[1]),
    )
