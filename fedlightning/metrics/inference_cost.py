"""Inference cost of a (pruned) model: multiply–accumulate operations per sample.

Counting rule (structured count of the non-zero weights that take part):

* a ``Linear`` weight costs one MAC per sample, a ``Conv2d`` weight one MAC per output
  position (``H_out · W_out``); zero weights cost nothing;
* a non-zero weight does not take part when its input unit is *dead*: an output unit (neuron
  or channel) of the previous weight layer is dead when all its incoming weights and its bias
  are zero, since it is then the constant ``act(0)`` and every model here uses ReLU (or none)
  between layers, so it carries no input signal. Conv channels feeding a ``Linear`` after a
  flatten are expanded to their ``H · W`` positions;
* biases, activations and pooling are not counted (the usual MAC convention).

Recurrent layers are counted per time step by :func:`lstm_step_macs` (not by :func:`count_macs`).

Dead-unit propagation follows the order of the weight layers in ``model.modules()``, which
is the data-flow order of the sequential models used here (logistic regression, MLPs,
``SmallCNN``). Output shapes come from one forward pass on a zero input.

>>> import torch
>>> lin = torch.nn.Linear(4, 2)
>>> with torch.no_grad():
...     _ = lin.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]]))
>>> total, dense, _ = count_macs(lin, (4,))
>>> (total, dense)
(2, 8)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

__all__ = ["LayerCost", "count_macs", "lstm_step_macs"]


def lstm_step_macs(*, input_size: int, hidden: Sequence[int], outputs: int, elementwise: bool = False) -> int:
    """MACs of one time step of stacked LSTM layers of widths ``hidden`` and a linear output layer.

    Convention (the usual one): each of the 4 gates of a layer of width h multiplies the layer's
    input (``input_size`` for the first layer, the previous layer's width after) and its previous
    hidden state by its weights, 4·(in + h)·h MACs per step; the output layer adds
    ``hidden[-1]·outputs``. Biases, the gates' non-linearities and element-wise products are not
    counted, as for ``Linear``/``Conv2d`` in :func:`count_macs`.

    With ``elementwise`` every other arithmetic operation of the step counts as one MAC too: per
    unit, the two biases of each gate (8), the sum of each gate's input and recurrent parts (4),
    the cell update f⊙c + i⊙g (3) and h = o⊙tanh(c) (1), i.e. 16·h per layer, and the output
    layer's ``outputs`` biases.

    Args:
        input_size: Width of the first layer's input (an embedding's dimension).
        hidden: Hidden width of every layer, first to last.
        outputs: Outputs of the linear layer on the last hidden state (a vocabulary's size).
        elementwise: Whether to count biases and the element-wise operations too.

    >>> lstm_step_macs(input_size=2, hidden=[3], outputs=4)  # 4·(2 + 3)·3 + 3·4
    72
    >>> lstm_step_macs(input_size=2, hidden=[3], outputs=4, elementwise=True)  # + 16·3 + 4
    124
    """
    total, width = 0, input_size
    for h in hidden:
        total += 4 * (width + h) * h + (16 * h if elementwise else 0)
        width = h
    return total + width * outputs + (outputs if elementwise else 0)


@dataclass(frozen=True)
class LayerCost:
    """MACs of one weight layer."""

    name: str
    macs: int
    dense_macs: int
    nonzero_weights: int
    weights: int


def count_macs(
    model: nn.Module, input_shape: Sequence[int], flat: Tensor | None = None
) -> tuple[int, int, list[LayerCost]]:
    """MACs per sample of ``model`` with parameters ``flat`` (default: its own).

    Returns:
        ``(macs, dense_macs, per_layer)``.
    """
    params = dict(model.named_parameters())
    if flat is not None:
        values: dict[str, Tensor] = {}
        offset = 0
        for name, p in params.items():
            values[name] = flat[offset : offset + p.numel()].reshape(p.shape).to(p.device)
            offset += p.numel()
        params = values  # type: ignore[assignment]
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    out_positions: dict[str, int] = {}

    def hook(name: str):
        def fn(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
            out_positions[name] = math.prod(output.shape[2:]) if output.ndim > 2 else 1

        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in layers]
    try:
        with torch.no_grad():
            device = next(model.parameters()).device
            functional_call(model, dict(params), (torch.zeros(1, *input_shape, device=device),))  # type: ignore[arg-type]
    finally:
        for h in handles:
            h.remove()

    total = dense_total = 0
    per_layer: list[LayerCost] = []
    alive_prev: Tensor | None = None  # alive output units of the previous weight layer
    prev_positions = 1
    for name, _module in layers:
        w = params[f"{name}.weight"] if name else params["weight"]
        b = params.get(f"{name}.bias" if name else "bias")
        nz = w.ne(0)
        in_units = w.shape[1]
        if alive_prev is not None:
            alive_in = alive_prev
            if alive_in.numel() != in_units and in_units % alive_in.numel() == 0:
                alive_in = alive_in.repeat_interleave(in_units // alive_in.numel())  # flatten after a conv
            if alive_in.numel() == in_units:
                shape = [1, in_units] + [1] * (w.ndim - 2)
                nz = nz & alive_in.reshape(shape)
        positions = out_positions.get(name, 1)
        macs = int(nz.sum()) * positions
        dense = w.numel() * positions
        total += macs
        dense_total += dense
        per_layer.append(LayerCost(name, macs, dense, int(w.ne(0).sum()), w.numel()))
        alive = nz.reshape(nz.shape[0], -1).any(dim=1)
        if b is not None:
            alive = alive | b.ne(0)
        alive_prev = alive
        prev_positions = positions
    del prev_positions
    return total, dense_total, per_layer
