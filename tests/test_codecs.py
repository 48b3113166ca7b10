"""Codecs: exact round trips and bit counts equal to the analytic size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlightning.compression.codecs import BFloat16Codec, BitPackCodec, Float16Codec, Float32Codec
from fedlightning.federated.channel import Channel
from fedlightning.federated.message import Message
from fedlightning.federated.params import flat_difference, flat_parameters
from fedlightning.federated.payloads import Payload
from fedlightning.federated.state import ClientStateStore
from fedlightning.models import build_model

MNISTFC_PARAMS = 784 * 300 + 300 + 300 * 100 + 100 + 100 * 10 + 10  # 266,610


def test_dense_float32_of_mnistfc_is_32_bits_per_parameter() -> None:
    model = build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert flat.numel() == MNISTFC_PARAMS == 266_610
    msg = Float32Codec().encode(flat)
    assert msg.num_bits == 32 * 266_610 == 8_531_520
    assert len(msg.payload) == 4 * 266_610
    assert torch.equal(msg.decode(), flat)


@pytest.mark.parametrize("codec", [Float32Codec(), Float16Codec(), BFloat16Codec()], ids=lambda c: c.name)
def test_dense_round_trip_is_exact_for_representable_values(codec: Float32Codec) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, generator=gen).to(codec.dtype).to(torch.float32)  # representable in the wire dtype
    msg = codec.encode(x)
    assert msg.num_bits == codec.bits_per_coordinate * 15
    assert msg.shape == (3, 5)
    assert torch.equal(msg.decode(), x)


def test_half_precision_rounds_to_nearest() -> None:
    x = torch.tensor([1.0 + 2**-12, 3.0e5])
    assert Float16Codec().encode(x).decode().tolist() == [1.0, float("inf")]  # 65504 is float16's max
    assert BFloat16Codec().encode(torch.tensor([1.0 + 2**-9])).decode().item() == 1.0


def test_bitpack_counts_one_bit_per_coordinate_without_padding() -> None:
    mask = torch.tensor([1, 0, 1, 1, 0, 0, 0, 1, 1, 0, 1], dtype=torch.float32)
    msg = BitPackCodec().encode(mask)
    assert msg.num_bits == 11
    assert len(msg.payload) == 2
    assert msg.payload[0] == 0b10001101  # LSB first
    assert torch.equal(msg.decode(), mask)


def test_bitpack_refuses_non_binary_values() -> None:
    with pytest.raises(ValueError, match="binary masks only"):
        BitPackCodec().encode(torch.tensor([0.0, 0.5]))


def test_message_rejects_padding_beyond_one_byte() -> None:
    with pytest.raises(ValueError, match="whole bytes"):
        Message(payload=b"\x00\x00", num_bits=3, codec=BitPackCodec(), shape=(3,))


def _bits(x: torch.Tensor) -> list[int]:
    return x.view(torch.int32).tolist()


def test_the_float32_uplink_hands_on_exactly_the_bits_its_message_decodes_to() -> None:
    # The plain float32 uplink does not rerun the decoder: what it hands to the aggregator must
    # be the message's decoded bits, signed zeros, a subnormal, the largest float and a NaN included.
    x = torch.tensor([0.1, -0.0, 0.0, 1e-41, -3.4028235e38, float("nan"), float("-inf")])
    channel = Channel(direction="uplink", payload=Payload.MODEL_DELTA, codec=Float32Codec(), method="test")
    message, decoded = channel.send(x, client_id=0, generator=None, state=ClientStateStore())
    assert message.num_bits == 32 * 7 and message.payload == x.numpy().tobytes()
    assert _bits(decoded) == _bits(message.decode()) == _bits(x)


def test_the_float32_uplink_message_lends_the_uploads_bytes_read_only_instead_of_copying() -> None:
    x = torch.tensor([0.25, -1.5, 3.0])
    channel = Channel(direction="uplink", payload=Payload.MODEL_DELTA, codec=Float32Codec(), method="test")
    message, _ = channel.send(x, client_id=0, generator=None, state=ClientStateStore())
    assert isinstance(message.payload, memoryview) and message.payload.readonly
    assert np.shares_memory(np.frombuffer(message.payload, dtype=np.float32), x.numpy())
    assert bytes(message.payload) == Float32Codec().encode(x).payload and len(message.payload) == 12
    with pytest.raises(ValueError, match="float32 CPU tensor only"):
        Float32Codec().borrowed(x.half())


def test_the_float16_uplink_hands_on_its_decoded_message_not_the_sent_tensor() -> None:
    x = torch.tensor([0.1, 1e5, 1e-41])
    channel = Channel(direction="uplink", payload=Payload.MODEL_DELTA, codec=Float16Codec(), method="test")
    message, decoded = channel.send(x, client_id=0, generator=None, state=ClientStateStore())
    assert torch.equal(decoded, message.decode())
    assert decoded.tolist() == [float(torch.tensor(0.1).half()), float("inf"), 0.0]


def test_the_flat_difference_is_the_flat_weights_minus_the_reference() -> None:
    model = build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)
    reference = torch.randn(MNISTFC_PARAMS, generator=torch.Generator().manual_seed(0))
    assert torch.equal(flat_difference(model, reference), flat_parameters(model) - reference)
    with pytest.raises(ValueError, match="A model with 266610 parameters has no difference with a vector of 5"):
        flat_difference(model, torch.zeros(5))
