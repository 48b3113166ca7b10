"""Flat views of a model's parameters, copied (never aliased) in and out.

``torch.nn.utils.vector_to_parameters`` makes parameters *views* of the vector, so local
training would silently write into the global state. These helpers
copy instead.

A model whose parameters were laid out as consecutive slices of one tensor
(:func:`lay_out_flat_`, what the engine does with its client model) is copied in and
differenced in one operation each instead of one per parameter.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
from torch import Tensor, nn

_LAID_OUT: weakref.WeakKeyDictionary[nn.Module, tuple[Tensor, tuple[int, ...]]] = weakref.WeakKeyDictionary()
"""Per module laid out by :func:`lay_out_flat_`: its flat tensor and the parameters' data pointers then."""


def flat_parameters(module: nn.Module) -> Tensor:
    """A new 1-D tensor holding every parameter of ``module``, in ``parameters()`` order."""
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def flat_difference(module: nn.Module, reference: Tensor) -> Tensor:
    """A new 1-D tensor ``flat_parameters(module) − reference``, written in one pass per parameter.

    >>> layer = nn.Linear(2, 1)
    >>> torch.equal(flat_difference(layer, torch.ones(3)), flat_parameters(layer) - 1)
    True
    """
    flat = flat_view(module)
    if flat is not None and flat.dtype == reference.dtype and flat.shape == reference.shape:
        return torch.sub(flat, reference)
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
    laid_out = flat_view(module)
    if laid_out is not None and laid_out.numel() == flat.numel():
        with torch.no_grad():
            laid_out.copy_(flat.reshape(-1))
        return
    offset = 0
    with torch.no_grad():
        for p in module.parameters():
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n
    if offset != flat.numel():
        raise ValueError(f"A flat vector of {flat.numel()} values cannot fill a model with {offset} parameters.")


def lay_out_flat_(module: nn.Module) -> Tensor | None:
    """Make the parameters of ``module`` consecutive slices of one new 1-D tensor (``parameters()`` order); that tensor.

    The parameters keep their identity (optimisers and hooks hold the same objects) and their
    values; only their storage moves. ``None``, and nothing changes, when the module has no
    parameters or they differ in dtype or device.

    >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    >>> flat = lay_out_flat_(net)
    >>> torch.equal(flat, flat_parameters(net)), flat_view(net) is flat
    (True, True)
    >>> with torch.no_grad():
    ...     _ = net[1].bias.fill_(7.0)
    >>> float(flat[-1])
    7.0
    """
    params = list(module.parameters())
    if not params or any(p.dtype != params[0].dtype or p.device != params[0].device for p in params):
        return None
    flat = flat_parameters(module)
    with torch.no_grad():
        for p, view in zip(params, unflatten_like(flat, params), strict=True):
            p.data = view
    _LAID_OUT[module] = (flat, tuple(p.data_ptr() for p in params))
    return flat


def flat_view(module: nn.Module) -> Tensor | None:
    """The tensor of :func:`lay_out_flat_` while ``module``'s parameters are still its slices, else ``None``.

    A parameter given other storage since (``p.data = …``, a move to another device) makes it
    ``None``: the per-parameter paths then serve.
    """
    laid_out = _LAID_OUT.get(module)
    if laid_out is None:
        return None
    flat, pointers = laid_out
    return flat if tuple(p.data_ptr() for p in module.parameters()) == pointers else None


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
