"""E-FLoPS's message: a top-m support with its weights, gate probabilities and the multiplier λ.

Paper: E-FLoPS, arXiv 2607.00275: every message carries the top-m coordinates of the gated
network (index-coded positions, θ̃ and π = P(z ≠ 0) on them, hard-concrete gates of Louizos et
al., arXiv 1712.01312) and the Lagrange multiplier λ. :func:`pack_gate_state` lays the logical
message out as one flat tensor, and :class:`GateMessageCodec` writes it bit-exactly.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fedlightning.compression.bitstream import BitReader, BitWriter
from fedlightning.compression.index_coding import read_positions, write_positions
from fedlightning.federated.message import Message

__all__ = ["GateMessageCodec", "pack_gate_state", "unpack_gate_state"]


def pack_gate_state(
    theta: Tensor, pi: Tensor, support: Tensor, lagrange: float | Tensor, pi_off: Tensor | None = None
) -> Tensor:
    """The logical message [θ̃ on S, π on S, π_off per group, λ] as one flat tensor.

    Zeros off S (π > 0 on S). ``pi_off`` (one value per parameter tensor, the mean P(z ≠ 0)
    of that tensor's coordinates outside S) is omitted when None (the ``"reset"`` variant).

    >>> pack_gate_state(torch.tensor([2.0, 3.0]), torch.tensor([0.5, 0.25]), torch.tensor([True, False]), 1.5).tolist()
    [2.0, 0.0, 0.5, 0.0, 1.5]
    """
    s = support.to(theta.dtype)
    lam = torch.as_tensor(lagrange, dtype=theta.dtype, device=theta.device).reshape(1)
    off = theta.new_zeros(0) if pi_off is None else pi_off.to(theta.dtype).reshape(-1)
    return torch.cat([theta * s, pi * s, off, lam])


def unpack_gate_state(flat: Tensor, num_groups: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Inverse of :func:`pack_gate_state`: ``(theta, pi, support, pi_off, lagrange)``.

    >>> theta, pi, support, pi_off, lam = unpack_gate_state(torch.tensor([2.0, 0.0, 0.5, 0.0, 0.7, 1.5]), 1)
    >>> theta.tolist(), support.tolist(), pi_off.tolist(), float(lam)
    ([2.0, 0.0], [True, False], [0.699999988079071], 1.5)
    """
    dim = (flat.numel() - 1 - num_groups) // 2
    theta, pi = flat[:dim], flat[dim : 2 * dim]
    pi_off, lam = flat[2 * dim : 2 * dim + num_groups], flat[-1]
    return theta, pi, pi > 0, pi_off, lam


class GateMessageCodec:
    """Bit-exact wire format of an E-FLoPS message.

    Stream: the index-coded positions of the support S (``write_positions``), then θ̃_S and
    π_S as float32, then the ``num_groups`` off-support statistics π_off (float32 each, one per
    parameter tensor; none in the ``"reset"`` variant), then λ as float32. ``header_bits``
    covers the position header, π_off and λ.

    Args:
        num_groups: number of per-tensor off-support statistics in every message.

    >>> theta = torch.tensor([0.0, 1.5, 0.0, -2.0]); pi = torch.tensor([0.0, 0.9, 0.0, 0.6])
    >>> x = pack_gate_state(theta, pi, pi > 0, 0.25)
    >>> msg = GateMessageCodec().encode(x)
    >>> torch.equal(msg.decode(), x), msg.num_bits - 32 * 5 > 0
    (True, True)
    """

    name = "eflops_gates"

    def __init__(self, *, num_groups: int = 0) -> None:
        self.num_groups = int(num_groups)

    def encode(self, x: Tensor) -> Message:
        flat = x.detach().reshape(-1).to(device="cpu", dtype=torch.float32)
        theta, pi, support, pi_off, lam = unpack_gate_state(flat, self.num_groups)
        positions = torch.nonzero(support, as_tuple=True)[0]
        w = BitWriter()
        header = write_positions(w, positions, theta.numel())
        w.write_array(theta[positions].numpy().view(np.uint32), 32)
        w.write_array(pi[positions].numpy().view(np.uint32), 32)
        if self.num_groups:
            w.write_array(pi_off.contiguous().numpy().view(np.uint32), 32)
        w.write_array(lam.reshape(1).numpy().view(np.uint32), 32)
        payload, n = w.getvalue()
        extra = 32 * (self.num_groups + 1)
        return Message(payload=payload, num_bits=n, codec=self, shape=tuple(x.shape), header_bits=header + extra)

    def decode(self, message: Message) -> Tensor:
        total = math.prod(message.shape)
        dim = (total - 1 - self.num_groups) // 2
        r = BitReader(message.payload, message.num_bits, codec=self.name)
        if total != 2 * dim + self.num_groups + 1 or dim < 0:
            raise r.error(f"a shape of {total} entries is not 2 d + {self.num_groups} + 1 for any dimension d")
        positions = torch.from_numpy(read_positions(r, dim))
        k = positions.numel()
        theta_s = r.read_array(k, 32).astype(np.uint32).view(np.float32)
        pi_s = r.read_array(k, 32).astype(np.uint32).view(np.float32)
        pi_off = r.read_array(self.num_groups, 32).astype(np.uint32).view(np.float32) if self.num_groups else None
        lam = r.read_array(1, 32).astype(np.uint32).view(np.float32)
        if r.remaining:
            raise r.error(f"{r.remaining} bits are left after decoding")
        values = np.concatenate([theta_s, pi_s, pi_off if pi_off is not None else pi_s[:0], lam])
        if not np.isfinite(values).all():
            raise r.error("a parameter, gate probability or multiplier is not finite")
        probabilities = np.concatenate([pi_s, pi_off if pi_off is not None else pi_s[:0]])
        if ((probabilities < 0) | (probabilities > 1)).any():
            raise r.error("a gate probability lies outside [0, 1]")
        out = torch.zeros(total, dtype=torch.float32)
        out[positions] = torch.from_numpy(theta_s.copy())
        out[dim + positions] = torch.from_numpy(pi_s.copy())
        if pi_off is not None:
            out[2 * dim : 2 * dim + self.num_groups] = torch.from_numpy(pi_off.copy())
        out[-1] = float(lam[0])
        return out.reshape(message.shape)
