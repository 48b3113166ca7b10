"""Error feedback: Example 4.7.1 (Top-1 diverges without EF, converges with it) and the callback memory."""

from __future__ import annotations

import torch

from fedlightning.compression import RandK, TopK, error_feedback_step
from fedlightning.compression.codecs import Float32Codec
from fedlightning.federated.channel import Channel
from fedlightning.federated.message import Message
from fedlightning.federated.payloads import Payload
from fedlightning.federated.state import ClientStateStore

A = torch.tensor([[-3.0, 2.0, 2.0], [2.0, -3.0, 2.0], [2.0, 2.0, -3.0]], dtype=torch.float64)


def grad_i(i: int, x: torch.Tensor) -> torch.Tensor:
    """∇ of f_i(x) = ⟨a_i, x⟩² + ¼‖x‖² (thesis Example 4.7.1)."""
    return 2 * (A[i] @ x) * A[i] + 0.5 * x


def run_dcgd(eta: float, steps: int, ef: bool) -> list[torch.Tensor]:
    top1 = TopK(k=1)
    x = torch.ones(3, dtype=torch.float64)
    e = [torch.zeros(3, dtype=torch.float64) for _ in range(3)]
    xs = [x]
    for _ in range(steps):
        sent = []
        for i in range(3):
            if ef:
                msg, e[i] = error_feedback_step(top1, eta * grad_i(i, x).float(), e[i].float(), torch.Generator())
                sent.append(msg.decode().double())
            else:
                sent.append(eta * top1(grad_i(i, x).float()).double())
        x = x - torch.stack(sent).mean(0)
        xs.append(x)
    return xs


def test_top1_without_error_feedback_diverges_exactly_as_predicted() -> None:
    eta = 0.05
    xs = run_dcgd(eta, 40, ef=False)
    growth = 1 + 11 * eta / 6
    for k in (1, 10, 40):
        assert torch.allclose(xs[k], torch.full((3,), growth**k, dtype=torch.float64), rtol=1e-5)


def test_top1_with_error_feedback_converges() -> None:
    xs = run_dcgd(0.05, 400, ef=True)
    assert float(xs[-1].norm()) < 1e-3 * float(xs[0].norm())  # x* = 0


def test_channel_keeps_per_client_memory_in_the_state_store() -> None:
    store = ClientStateStore()
    channel = Channel(direction="uplink", payload=Payload.MODEL_DELTA, codec=Float32Codec(), method="test")
    channel.attach(TopK(k=1), error_feedback=True)
    upload = torch.tensor([1.0, 0.5, 0.25, 0.0])

    def send(round_idx: int, client_id: int) -> Message:
        gen = torch.Generator().manual_seed(round_idx * 1000 + client_id)
        return channel.encode(upload, client_id=client_id, generator=gen, state=store)

    m0 = send(0, 7)
    assert m0.decode().tolist() == [1.0, 0.0, 0.0, 0.0]
    assert store.get(7, "ef_memory").tolist() == [0.0, 0.5, 0.25, 0.0]
    m1 = send(1, 7)
    assert int((m1.decode() != 0).sum()) == 1
    # memory + upload = sent + new memory (nothing is lost)
    total = upload + torch.tensor([0.0, 0.5, 0.25, 0.0])
    assert torch.allclose(m1.decode() + store.get(7, "ef_memory"), total)
    assert store.get(3, "ef_memory") is None
    # an unbiased operator without EF keeps no state
    plain = Channel(direction="uplink", payload=Payload.MODEL_DELTA, codec=Float32Codec(), method="test")
    plain.attach(RandK(k=2))
    plain.encode(upload, client_id=3, generator=torch.Generator(), state=store)
    assert store.get(3, "ef_memory") is None
