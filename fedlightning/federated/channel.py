"""Channels: the one path from a payload to a :class:`Message`, per direction.

Each :class:`FederatedModule` owns an uplink and a downlink :class:`Channel`. A channel holds

* the payload its method declared (:class:`~fedlightning.federated.payloads.Payload`);
* the method's own codec (IEEE floats, bit-packed masks, range-coded masks, sparse formats),
  used when no operator is attached;
* at most one compression operator, attached before training (``compressor=`` and
  ``downlink=`` do this through :mod:`fedlightning.callbacks.compression`), applied to each
  parameter tensor (``granularity="layer"``) or to the flat vector (``"model"``);
* error-feedback memory (thesis arXiv 2207.00392, Algorithm 4/6), kept per client in the
  module's checkpointed client state store;
* the operator's ω, δ and unbiasedness (:meth:`Channel.metadata`), which step-size rules
  (DCSGD, DIANA) read from here.

An operator is only attached to a payload it :attr:`~fedlightning.federated.operator.Operator.accepts`;
anything else stops with one sentence naming the method, the operator and what would fit.

The downlink channel (:class:`DownlinkChannel`) sends the broadcast with the method's codec. A
compressed broadcast needs a master-compression scheme, and the ``downlink=`` configs
(:class:`fedlightning.callbacks.compression.DownlinkCompression`) replace this channel with one
of the two of :mod:`fedlightning.callbacks.compression`: the thesis's Algorithm 1 (the
compressed aggregate step, no memory) or a replica that starts from the initial model, sent
once. An operator attached to the plain channel is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from torch import Tensor

from fedlightning.errors import ConfigError
from fedlightning.federated.message import Codec, Message, SentShare
from fedlightning.federated.payloads import Payload
from fedlightning.federated.rng import SERVER

if TYPE_CHECKING:
    from fedlightning.federated.operator import Operator
    from fedlightning.federated.state import ClientStateStore

__all__ = [
    "Channel",
    "ChannelMetadata",
    "DownlinkChannel",
    "IncompatiblePayloadError",
    "ReplicaCodec",
]

Direction = Literal["uplink", "downlink"]
MEMORY_KEY = "ef_memory"
"""Key of a client's error-feedback memory in the client state store."""


@dataclass(frozen=True)
class ChannelMetadata:
    """What a step-size rule needs to know of a channel's operator (thesis §1.6 conventions).

    Attributes:
        name: the operator (``identity`` when nothing is attached).
        unbiased: E[C(x)] = x.
        omega: ω with E‖C(x) − x‖² ≤ ω‖x‖² (``None`` for biased operators).
        delta: δ with E‖C(x) − x‖² ≤ (1 − 1/δ)‖x‖².
        error_feedback: whether the channel keeps error-feedback memory.
        dim: the dimension these values refer to.
    """

    name: str
    unbiased: bool
    omega: float | None
    delta: float
    error_feedback: bool
    dim: int


class IncompatiblePayloadError(ConfigError):
    """An operator was put on a payload it does not accept; the message is one sentence."""

    def __init__(
        self, *, method: str, direction: Direction, payload: Payload, compressor: str, accepts: frozenset[Payload]
    ) -> None:
        self.method, self.direction, self.payload = method, direction, payload
        self.compressor, self.accepts = compressor, accepts
        group = "compressor" if direction == "uplink" else "downlink"
        takes = " and ".join(sorted(f"{p}s" for p in accepts)) or "nothing"
        super().__init__(
            f"{method}'s {direction} payload ({payload}) is not one the {direction} compressor {compressor} "
            f"compresses (it takes {takes}); use {group}=none (the method's own codec)."
        )


class Channel:
    """One direction of a method's communication (see the module docstring).

    Args:
        direction: ``"uplink"`` or ``"downlink"``.
        payload: what the method sends in this direction.
        codec: the method's own wire format, used when no operator is attached.
        method: the method's name, for error messages.
    """

    def __init__(self, *, direction: Direction, payload: Payload, codec: Codec, method: str) -> None:
        self.direction: Direction = direction
        self.payload = payload
        self.codec = codec
        self.method = method
        self.compressor: Operator | None = None
        self.error_feedback = False
        self.granularity: Literal["layer", "model"] = "layer"
        self._block_sizes: list[int] = []
        self._operators: dict[int, Operator] = {}
        self.per_client = False  # a downlink whose clients each get their own message

    # ------------------------------------------------------------------ configuration
    @property
    def compressed_payload(self) -> Payload:
        """The payload the operator sees (the uplink payload itself)."""
        return self.payload

    def check_payload(self, compressor: Operator) -> None:
        """Stop with :class:`IncompatiblePayloadError` unless ``compressor`` accepts this channel's payload."""
        if self.compressed_payload not in compressor.accepts:
            raise IncompatiblePayloadError(
                method=self.method,
                direction=self.direction,
                payload=self.payload,
                compressor=compressor.name,
                accepts=compressor.accepts,
            )

    def attach(
        self,
        compressor: Operator,
        *,
        error_feedback: bool = False,
        granularity: Literal["layer", "model"] = "layer",
        block_sizes: list[int] | None = None,
    ) -> None:
        """Put ``compressor`` on this channel, or refuse it in one sentence.

        Args:
            compressor: the operator.
            error_feedback: keep per-client memory e_i and compress e_i + v (Algorithm 4/6).
            granularity: ``"layer"``: one operator application per block of ``block_sizes``
                (the model's parameter tensors); ``"model"``: the flat vector.
            block_sizes: sizes of the parameter tensors, in order.
        """
        if self.compressor is not None:
            raise ConfigError(
                f"The {self.direction} channel of {self.method} already has the compressor {self.compressor.name}; "
                f"configure one {self.direction} compressor."
            )
        if granularity not in ("layer", "model"):
            raise ConfigError(f"compressor granularity must be 'layer' or 'model' (got {granularity!r}).")
        if self.per_client:
            raise ConfigError(
                f"{self.method} sends each client its own message, which a downlink compressor (one replica of a "
                "broadcast) cannot serve; use downlink=none."
            )
        if error_feedback and self.direction == "downlink":
            raise ConfigError(
                "The downlink replica already re-sends the compression error; downlink error feedback does not exist."
            )
        self.check_payload(compressor)
        self.compressor = compressor
        self.error_feedback = bool(error_feedback)
        self.granularity = granularity
        self._block_sizes = list(block_sizes or [])
        self._operators.clear()

    def operator(self, numel: int) -> Operator:
        """The attached operator as applied to a flat vector of ``numel`` entries (layer-wise if the blocks fit)."""
        if self.compressor is None:
            raise ValueError(f"The {self.direction} channel of {self.method} has no operator attached.")
        if numel not in self._operators:
            sizes = self._block_sizes
            layerwise = self.granularity == "layer" and len(sizes) > 1 and sum(sizes) == numel
            self._operators[numel] = self.compressor.blockwise(sizes) if layerwise else self.compressor
        return self._operators[numel]

    def metadata(self, dim: int) -> ChannelMetadata:
        """ω, δ and unbiasedness of what this channel applies to a ``dim``-vector (the identity: ω = 0, δ = 1)."""
        if self.compressor is None:
            return ChannelMetadata(
                name="identity", unbiased=True, omega=0.0, delta=1.0, error_feedback=self.error_feedback, dim=dim
            )
        op = self.operator(dim)
        return ChannelMetadata(
            name=op.name,
            unbiased=bool(op.unbiased),
            omega=op.omega(dim) if op.unbiased else None,
            delta=float(op.delta(dim)),
            error_feedback=self.error_feedback,
            dim=dim,
        )

    # ------------------------------------------------------------------ the wire
    def encode(
        self, x: Tensor, *, client_id: int, generator: torch.Generator | None, state: ClientStateStore
    ) -> Message:
        """The message that carries ``x`` from ``client_id`` (the sender) in this direction."""
        return self.send(x, client_id=client_id, generator=generator, state=state)[0]

    def send(
        self, x: Tensor, *, client_id: int, generator: torch.Generator | None, state: ClientStateStore
    ) -> tuple[Message, Tensor]:
        """The message that carries ``x`` and the tensor the receiver decodes from it (decoded once).

        A codec that :meth:`~fedlightning.federated.codecs.DenseCodec.reproduces` ``x`` (float32
        on the float32 wire) is not decoded: ``x`` itself is what decoding would return, bit for bit;
        on the CPU its message's payload is a read-only view of ``x``'s bytes
        (:meth:`~fedlightning.federated.codecs.DenseCodec.borrowed`), so ``x`` must not be
        modified after it is sent.
        ``generator`` is the sender's compression stream (only an attached operator draws from
        it; ``None`` is fine without one); ``state`` holds error-feedback memory.
        """
        if self.compressor is None:
            reproduces = getattr(self.codec, "reproduces", None)  # a lossless wire: decoding gives x's bits
            if reproduces is None or not reproduces(x):
                message = self.codec.encode(x)
                return message, message.decode()
            if x.device.type == "cpu" and hasattr(self.codec, "borrowed"):
                message = self.codec.borrowed(x)  # the payload is x's own bytes, not a copy
            else:
                message = self.codec.encode(x)
            return message, x.detach().reshape(message.shape)
        if generator is None:
            raise ValueError(f"The {self.direction} operator {self.compressor.name} needs the sender's random stream.")
        op = self.operator(x.numel())
        if not self.error_feedback:
            message = op.compress(x, generator)
            return message, message.decode()
        memory = state.get(client_id, MEMORY_KEY)
        corrected = x if memory is None else memory.to(x.device) + x
        message = op.compress(corrected, generator)
        decoded = message.decode()
        state.set(client_id, MEMORY_KEY, corrected - decoded.to(x.device, x.dtype))
        return message, decoded

    def send_share(
        self,
        x: Tensor,
        *,
        client_ids: list[int],
        generator: Callable[[int], torch.Generator | None],
        state: ClientStateStore,
    ) -> tuple[SentShare, Tensor | list[Tensor]]:
        """The messages that carry the rows of ``x`` (K, ...) from ``client_ids`` and what the receiver decodes.

        Without an operator, a codec that encodes rows in bulk (``encode_rows``, as
        :class:`~fedlightning.federated.codecs.DenseCodec`) sends the whole share at once: its
        messages and decoded rows are those :meth:`send` gives each row. Otherwise each row is
        sent in turn by :meth:`send` (an operator draws from each sender's own stream
        ``generator(client_id)`` and error feedback updates each sender's memory), and the
        decoded rows are returned as a list; an operator's share is copied to the host once.
        """
        encode_rows = getattr(self.codec, "encode_rows", None)
        if self.compressor is None and encode_rows is not None:
            sent, decoded = encode_rows(x, client_ids=client_ids)
            return sent, decoded
        if self.compressor is not None:  # operators write their streams on the host: one transfer for the share
            x = x.detach().to("cpu")
        messages, rows = [], []
        for k, client_id in enumerate(client_ids):
            gen = generator(client_id) if self.compressor is not None else None
            message, decoded_row = self.send(x[k], client_id=client_id, generator=gen, state=state)
            messages.append(message)
            rows.append(decoded_row)
        return SentShare.of(client_ids, messages), rows


class ReplicaCodec:
    """Decodes a downlink message as ``reference + C(x − reference)``."""

    def __init__(self, compressor: Operator, reference: Tensor) -> None:
        self.compressor = compressor
        self.reference = reference
        self.name = f"replica[{compressor.name}]"

    @classmethod
    def wrap(cls, inner: Message, compressor: Operator, reference: Tensor) -> Message:
        """``inner`` (``compressor``'s message of a difference) as a message that decodes to ``reference`` + it."""
        return Message(
            payload=inner.payload,
            num_bits=inner.num_bits,
            codec=cls(compressor, reference.detach().clone()),
            shape=inner.shape,
            header_bits=inner.header_bits,
        )

    def encode(self, x: Tensor) -> Message:
        raise TypeError("ReplicaCodec only decodes; DownlinkChannel.encode writes its messages.")

    def decode(self, message: Message) -> Tensor:
        """``reference + C(x − reference)`` on the reference's device (the operator decodes on the CPU)."""
        inner = Message(payload=message.payload, num_bits=message.num_bits, codec=self.compressor, shape=message.shape)
        return self.reference.reshape(message.shape) + self.compressor.decode(inner).to(self.reference.device)


class DownlinkChannel(Channel):
    """The broadcast channel: the method's codec; compression only in a subclass that names its scheme.

    Subclasses (:mod:`fedlightning.callbacks.compression`) set :attr:`scheme` and implement
    :meth:`send` for an attached operator; the plain channel refuses one in :meth:`attach`, so a
    compressed broadcast always follows a scheme that says what the clients hold.
    """

    scheme: ClassVar[str | None] = None
    """The master-compression scheme of a subclass (``None``: the plain channel, no operator)."""

    def __init__(self, *, payload: Payload, codec: Codec, method: str, per_client: bool = False) -> None:
        super().__init__(direction="downlink", payload=payload, codec=codec, method=method)
        self.per_client = per_client

    def after_server_step(self, module: object, round_idx: int) -> None:
        """Called by the engine right after an applied server step (default: nothing)."""

    @property
    def compressed_payload(self) -> Payload:
        """A model broadcast reaches the operator as a model delta (a step, or x − x̂); other payloads as they are."""
        return Payload.MODEL_DELTA if self.payload is Payload.MODEL else self.payload

    def attach(
        self,
        compressor: Operator,
        *,
        error_feedback: bool = False,
        granularity: Literal["layer", "model"] = "layer",
        block_sizes: list[int] | None = None,
    ) -> None:
        """Refused on the plain channel (one sentence); a scheme's subclass attaches as :meth:`Channel.attach`."""
        if self.scheme is None:
            raise ConfigError(
                f"The plain downlink channel of {self.method} has no master-compression scheme for {compressor.name}; "
                "attach a downlink operator through fedlightning.callbacks.compression.DownlinkCompression "
                "(downlink=<name>, downlink.scheme=aggregate or replica)."
            )
        super().attach(compressor, error_feedback=error_feedback, granularity=granularity, block_sizes=block_sizes)

    def send(
        self, x: Tensor, *, client_id: int = SERVER, generator: torch.Generator | None, state: ClientStateStore
    ) -> tuple[Message, Tensor]:
        """The broadcast in the method's codec (a scheme's subclass sends an attached operator's messages)."""
        if self.compressor is not None:
            raise ConfigError(
                f"{type(self).__name__} has the operator {self.compressor.name} but no send of its scheme; "
                "a downlink scheme implements send for its operator."
            )
        message = self.codec.encode(x)
        return message, message.decode()
