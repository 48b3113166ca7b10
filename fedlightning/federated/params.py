"""Flat views of a model's parameters, copied (never aliased) in and out.

``torch.nn.utils.vector_to_parameters`` makes parameters *views* of the vector, so local
training would silently write into the global state. These helpers
copy instead.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


def flat_parameters(module: nn.Module) -> Tensor:
    """A new 1-D tensor holding every parameter of ``module``, in ``parameters()`` order."""
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def flat_difference(module: nn.Module, reference: Tensor) -> Tensor:
    """A new 1-D tensor ``flat_parameters(module) − reference``, written in one pass per parameter.

    >>> layer = nn.Linear(2, 1)
    >>> torch.equal(flat_difference(layer, torch.ones(3)), flat_parameters(layer) - 1)
    True
    """
    size = num_parameters(module)
    if size != reference.numel():
        raise ValueError(f"A model with {size} parameters has no difference with a vector of {reference.numel()}.")
    out = torch.empty_like(reference)
    offset = 0
    with torch.no_grad():
        for p in module.parameters():
            n = p.numel()
            torch.sub(p.reshape(-1), reference[offset : offset + n], out=out[offset : offset + n])
            offset += n
    return out


def assign_flat_(module: nn.Module, flat: Tensor) -> None:
    """Copy ``flat`` into the parameters of ``module`` in place."""
    offset = 0
    with torch.no_grad():
        for p in module.parameters():
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n
    if offset != flat.numel():
        raise ValueError(f"A flat vector of {flat.numel()} values cannot fill a model with {offset} parameters.")


def set_flat_grad_(params: list[nn.Parameter], flat: Tensor) -> None:
    """Set ``p.grad`` of each parameter from consecutive slices of ``flat`` (copies)."""
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n
    if offset != flat.numel():
        raise ValueError(f"A pseudo-gradient of {flat.numel()} values does not match {offset} server parameters.")


def unflatten_like(flat: Tensor, like: Iterable[Tensor]) -> list[Tensor]:
    """Views of the flat vector ``flat`` shaped as each tensor of ``like``, in order (no copy).

    >>> [v.tolist() for v in unflatten_like(torch.arange(5.0), [torch.zeros(2, 2), torch.zeros(1)])]
    [[[0.0, 1.0], [2.0, 3.0]], [4.0]]
    """
    shapes = [t.shape for t in like]
    pieces = torch.split(flat, [s.numel() for s in shapes])
    return [piece.view(shape) for piece, shape in zip(pieces, shapes, strict=True)]


def num_parameters(module: nn.Module) -> int:
    """Number of scalar parameters of ``module``."""
    return sum(p.numel() for p in module.parameters())
