"""Ordered Dropout (OD): nested sub-models F_p of one network (FjORD, arXiv 2102.13451; thesis arXiv 2207.00392, ch. 7).

For a width rate p ∈ (0, 1], the sub-model F_p keeps the first ⌈p·K_l⌉ units of every
droppable layer l of width K_l (neurons of a linear layer, output channels of a convolution,
hidden units of an LSTM layer) and removes every connection to a dropped unit: the output
dimension of layer l and the input dimension of layer l + 1 are sliced together. The output
layer is never dropped and neither is the input (nor a character embedding). Widths are
nested, p₁ < p₂ ⇒ F_{p₁} ⊂ F_{p₂}, so one set of weights serves every width.

The networks here run *functionally* on the parameters of an unchanged model
(:class:`~fedlightning.models.mlp.MLP`, :class:`~fedlightning.models.cnn.SmallCNN`,
:class:`~fedlightning.models.cnn.FemnistCNN`,
:class:`~fedlightning.models.resnet.ResNet18GN`, :class:`~fedlightning.models.char_lstm.CharLSTM`
and plain ``nn.Sequential`` stacks of ``Linear``/``ReLU``/``Flatten``), so the presets build
them as usual and gradients reach exactly the coordinates of the sub-model that ran.

A sub-model is described by its **units**: one sorted index tensor per droppable unit group
(:meth:`ODArchitecture.widths`); OD keeps prefixes (:func:`ordered_units`), Federated Dropout
(arXiv 1812.07210) keeps random subsets (:func:`random_units`). :func:`sub_model_indices`
turns units into the flat-parameter index set (in ``model.parameters()`` order), which is what a
sub-model's weights are sent and received as.

Residual networks: the channels of a residual stream (stem and stage 1, then each later
stage) form one unit group, so a block's output and its shortcut keep the same channels.

GroupNorm under slicing: a channel keeps the group it has in the full model (groups are
consecutive blocks of C/G channels); each group is normalised over those of its channels
that the sub-model keeps, with the kept channels' affine parameters. Ordered widths therefore
keep every full group whole and the last one partial (e.g. ⌈0.2·64⌉ = 13 channels of a
2-group layer: one group of 13); at p = 1 this is exactly ``nn.GroupNorm``. BatchNorm
(whose running statistics would need one copy per width) is not supported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.errors import ConfigError
from fedlightning.metrics.inference_cost import lstm_step_macs
from fedlightning.models.char_lstm import CharLSTM
from fedlightning.models.cnn import FemnistCNN, SmallCNN
from fedlightning.models.mlp import MLP
from fedlightning.models.resnet import ResNet18GN

__all__ = [
    "ODArchitecture",
    "OrderedDropout",
    "od_architecture",
    "od_index_set",
    "od_width",
    "ordered_units",
    "random_units",
    "sub_model_indices",
    "sub_model_macs",
]

Units = Sequence[Tensor]
"""One sorted ``int64`` index tensor of kept units per droppable unit group."""


def od_width(p: float, k: int) -> int:
    """⌈p·K⌉ units of a layer of width K (float noise such as 0.6·5 = 3.0000000000000004 is ignored).

    >>> [od_width(p, 64) for p in (0.2, 0.4, 0.6, 0.8, 1.0)]
    [13, 26, 39, 52, 64]
    >>> od_width(0.6, 5), od_width(0.7, 10)
    (3, 7)
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"A width rate p must lie in (0, 1] (got {p}).")
    return max(1, min(k, math.ceil(round(p * k, 9))))


def ordered_units(widths: Sequence[int], p: float) -> list[Tensor]:
    """OD's units of F_p: the first ⌈p·K_l⌉ of every group.

    >>> [u.tolist() for u in ordered_units([5, 3], 0.4)]
    [[0, 1], [0, 1]]
    """
    return [torch.arange(od_width(p, k)) for k in widths]


def random_units(widths: Sequence[int], *, outer: float, inner: float, generator: torch.Generator) -> list[Tensor]:
    """Random dropout inside F_outer: ⌈inner·K_l⌉ units drawn uniformly from F_outer's ⌈outer·K_l⌉ (sorted).

    Adaptive dropout and (extended) Federated Dropout (arXiv 2102.13451, Algorithm 11;
    arXiv 1812.07210): every group keeps exactly ⌈inner·K_l⌉ units.
    """
    if inner > outer:
        raise ValueError(f"Random dropout keeps fewer units than it draws from (inner {inner} > outer {outer}).")
    units = []
    for k in widths:
        pool, keep = od_width(outer, k), od_width(inner, k)
        units.append(torch.randperm(pool, generator=generator)[:keep].sort().values)
    return units


def _is_prefix(idx: Tensor) -> bool:
    return idx.numel() == 0 or int(idx[-1]) == idx.numel() - 1


def _take(w: Tensor, dim: int, idx: Tensor | None) -> Tensor:
    """``w`` restricted to indices ``idx`` along ``dim`` (a view for prefixes; ``None``: all)."""
    if idx is None or idx.numel() == w.shape[dim]:
        return w
    if _is_prefix(idx):
        return w.narrow(dim, 0, idx.numel())
    return w.index_select(dim, idx.to(w.device))


def _group_norm(x: Tensor, norm: nn.GroupNorm, units: Tensor) -> Tensor:
    """GroupNorm of the kept channels ``units``, each in its full-model group (module docstring)."""
    size = norm.num_channels // norm.num_groups
    weight, bias = _take(norm.weight, 0, units), _take(norm.bias, 0, units)
    if _is_prefix(units) and units.numel() % size == 0:
        return F.group_norm(x, units.numel() // size, weight, bias, norm.eps)
    groups = torch.div(units, size, rounding_mode="floor").to(x.device)
    _, members = torch.unique_consecutive(groups, return_inverse=True)
    onehot = F.one_hot(members).to(x.dtype)  # (c', g)
    counts = onehot.sum(0) * x[0, 0].numel()  # values per group and sample
    mean_c = (x.sum((2, 3)) @ onehot / counts) @ onehot.T  # (N, c')
    centred = x - mean_c[:, :, None, None]
    var_c = ((centred**2).sum((2, 3)) @ onehot / counts) @ onehot.T
    out = centred / torch.sqrt(var_c[:, :, None, None] + norm.eps)
    return out * weight[None, :, None, None] + bias[None, :, None, None]


def _product_indices(kept: Sequence[Tensor], shape: Sequence[int]) -> Tensor:
    """Row-major flat indices of the Cartesian product of per-dimension index tensors."""
    flat = torch.zeros(1, dtype=torch.long)
    for idx, size in zip(kept, shape, strict=True):
        flat = (flat[:, None] * size + idx[None, :]).reshape(-1)
    return flat


class ODArchitecture:
    """How one model family runs as a sub-model (subclasses per family).

    Args:
        model: the model whose structure (not its parameter values) this describes; the
            forward takes the module to run, so one description serves copies of it.
    """

    def __init__(self, model: nn.Module) -> None:
        self.template: Any = model

    def widths(self) -> list[int]:
        """K_l of every droppable unit group."""
        raise NotImplementedError

    def forward(self, model: nn.Module, x: Tensor, units: Units) -> Tensor:
        """The sub-model with ``units`` applied to ``x`` (on ``model``'s parameters)."""
        raise NotImplementedError

    def kept(self, units: Units) -> dict[str, tuple[Tensor | None, ...]]:
        """Per parameter name, the kept indices of every dimension (``None``: the whole dimension)."""
        raise NotImplementedError


def _full(n: int) -> Tensor:
    return torch.arange(n)


class SequentialMLPArchitecture(ODArchitecture):
    """``Flatten``/``Linear``/``ReLU`` stacks (``MLP.net`` or a plain ``nn.Sequential``): hidden neurons drop."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.seq = model.net if isinstance(model, MLP) else model
        self.prefix = "net." if isinstance(model, MLP) else ""
        self.linears = [(name, m) for name, m in self.seq.named_children() if isinstance(m, nn.Linear)]

    def widths(self) -> list[int]:
        return [m.out_features for _, m in self.linears[:-1]]

    def _io(self, j: int, units: Units) -> tuple[Tensor | None, Tensor | None]:
        out = units[j] if j < len(self.linears) - 1 else None
        inp = units[j - 1] if j > 0 else None
        return out, inp

    def forward(self, model: Any, x: Tensor, units: Units) -> Tensor:
        seq = model.net if isinstance(model, MLP) else model
        j = 0
        for layer in seq.children():
            if isinstance(layer, nn.Linear):
                out, inp = self._io(j, units)
                bias = None if layer.bias is None else _take(layer.bias, 0, out)
                x = F.linear(x, _take(_take(layer.weight, 0, out), 1, inp), bias)
                j += 1
            else:
                x = layer(x)
        return x

    def kept(self, units: Units) -> dict[str, tuple[Tensor | None, ...]]:
        result: dict[str, tuple[Tensor | None, ...]] = {}
        for j, (name, layer) in enumerate(self.linears):
            out, inp = self._io(j, units)
            result[f"{self.prefix}{name}.weight"] = (out, inp)
            if layer.bias is not None:
                result[f"{self.prefix}{name}.bias"] = (out,)
        return result


class SmallCNNArchitecture(ODArchitecture):
    """:class:`SmallCNN` (FedAvg's CNN and the digits CNN): both convolutions' channels and the hidden FC units drop."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        conv1, conv2 = model.features[0], model.features[3]
        fc1 = model.classifier[1]
        self.spatial = fc1.in_features // conv2.out_channels
        self._widths = [conv1.out_channels, conv2.out_channels, fc1.out_features]

    def widths(self) -> list[int]:
        return list(self._widths)

    def _fc1_inputs(self, channels: Tensor) -> Tensor:
        return (channels[:, None] * self.spatial + torch.arange(self.spatial)).reshape(-1)

    def _features(self, model: Any, x: Tensor, c1: Tensor, c2: Tensor) -> Tensor:
        """The two ``conv -> ReLU -> max-pool`` blocks on channels ``c1``, ``c2``, flattened."""
        conv1, conv2 = model.features[0], model.features[3]
        x = F.conv2d(
            x, _take(conv1.weight, 0, c1), _take(conv1.bias, 0, c1), stride=conv1.stride, padding=conv1.padding
        )
        x = F.max_pool2d(F.relu(x), 2)
        w2, b2 = _take(_take(conv2.weight, 0, c2), 1, c1), _take(conv2.bias, 0, c2)
        x = F.conv2d(x, w2, b2, stride=conv2.stride, padding=conv2.padding)
        return F.max_pool2d(F.relu(x), 2).flatten(1)

    def _fc1_weight(self, weight: Tensor, c2: Tensor) -> Tensor:
        """The columns of the first linear layer that the flattened channels ``c2`` feed."""
        return weight if c2.numel() == self._widths[1] else _take(weight, 1, self._fc1_inputs(c2))

    def forward(self, model: Any, x: Tensor, units: Units) -> Tensor:
        c1, c2, h = units
        fc1, fc2 = model.classifier[1], model.classifier[3]
        x = self._features(model, x, c1, c2)
        x = F.relu(F.linear(x, self._fc1_weight(_take(fc1.weight, 0, h), c2), _take(fc1.bias, 0, h)))
        return F.linear(x, _take(fc2.weight, 1, h), fc2.bias)

    def kept(self, units: Units) -> dict[str, tuple[Tensor | None, ...]]:
        c1, c2, h = units
        return {
            "features.0.weight": (c1, None, None, None),
            "features.0.bias": (c1,),
            "features.3.weight": (c2, c1, None, None),
            "features.3.bias": (c2,),
            "classifier.1.weight": (h, self._fc1_inputs(c2)),
            "classifier.1.bias": (h,),
            "classifier.3.weight": (None, h),
            "classifier.3.bias": (None,),
        }


class FemnistCNNArchitecture(SmallCNNArchitecture):
    """:class:`FemnistCNN` (FjORD's FEMNIST CNN): both convolutions' channels drop, the softmax layer's outputs stay."""

    def __init__(self, model: Any) -> None:
        ODArchitecture.__init__(self, model)
        conv1, conv2 = model.features[0], model.features[3]
        self.spatial = model.classifier[1].in_features // conv2.out_channels
        self._widths = [conv1.out_channels, conv2.out_channels]

    def forward(self, model: Any, x: Tensor, units: Units) -> Tensor:
        c1, c2 = units
        fc = model.classifier[1]
        return F.linear(self._features(model, x, c1, c2), self._fc1_weight(fc.weight, c2), fc.bias)

    def kept(self, units: Units) -> dict[str, tuple[Tensor | None, ...]]:
        c1, c2 = units
        return {
            "features.0.weight": (c1, None, None, None),
            "features.0.bias": (c1,),
            "features.3.weight": (c2, c1, None, None),
            "features.3.bias": (c2,),
            "classifier.1.weight": (None, self._fc1_inputs(c2)),
            "classifier.1.bias": (None,),
        }


class ResNet18GNArchitecture(ODArchitecture):
    """:class:`ResNet18GN`: unit groups are the four residual streams, then each block's inner channels."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        blocks = list(model.layers)
        self.streams = [blocks[2 * s].conv2.out_channels for s in range(4)]
        self.inner = [b.conv1.out_channels for b in blocks]

    def widths(self) -> list[int]:
        return [*self.streams, *self.inner]

    @staticmethod
    def _block_groups(b: int) -> tuple[int, int, int]:
        """(input stream, output stream, inner group) of block ``b``."""
        return max(0, (b - 1) // 2) if b else 0, b // 2, 4 + b

    def forward(self, model: Any, x: Tensor, units: Units) -> Tensor:
        conv, norm = model.stem[0], model.stem[1]
        x = F.relu(_group_norm(F.conv2d(x, _take(conv.weight, 0, units[0]), padding=1), norm, units[0]))
        for b, block in enumerate(model.layers):
            a, o, h = (units[g] for g in self._block_groups(b))
            c1, c2 = block.conv1, block.conv2
            out = F.conv2d(x, _take(_take(c1.weight, 0, h), 1, a), stride=c1.stride, padding=1)
            out = F.relu(_group_norm(out, block.norm1, h))
            out = _group_norm(F.conv2d(out, _take(_take(c2.weight, 0, o), 1, h), padding=1), block.norm2, o)
            if isinstance(block.shortcut, nn.Sequential):
                sconv: Any = block.shortcut[0]
                snorm: Any = block.shortcut[1]
                short = F.conv2d(x, _take(_take(sconv.weight, 0, o), 1, a), stride=sconv.stride)
                short = _group_norm(short, snorm, o)
            else:
                short = x
            x = F.relu(out + short)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.linear(x, _take(model.fc.weight, 1, units[3]), model.fc.bias)

    def kept(self, units: Units) -> dict[str, tuple[Tensor | None, ...]]:
        s0 = units[0]
        result: dict[str, tuple[Tensor | None, ...]] = {
            "stem.0.weight": (s0, None, None, None),
            "stem.1.weight": (s0,),
            "stem.1.bias": (s0,),
        }
        for b, block in enumerate(self.template.layers):
            a, o, h = (units[g] for g in self._block_groups(b))
            p = f"layers.{b}."
            result |= {
                p + "conv1.weight": (h, a, None, None),
                p + "norm1.weight": (h,),
                p + "norm1.bias": (h,),
                p + "conv2.weight": (o, h, None, None),
                p + "norm2.weight": (o,),
                p + "norm2.bias": (o,),
            }
            if isinstance(block.shortcut, nn.Sequential):
                result |= {
                    p + "shortcut.0.weight": (o, a, None, None),
                    p + "shortcut.1.weight": (o,),
                    p + "shortcut.1.bias": (o,),
                }
        result |= {"fc.weight": (None, units[3]), "fc.bias": (None,)}
        return result


class CharLSTMArchitecture(ODArchitecture):
    """:class:`CharLSTM`: the hidden units of every LSTM layer drop (all four gates of a unit together)."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        lstm = model.lstm
        if lstm.bidirectional or lstm.proj_size or lstm.dropout or not lstm.bias or not lstm.batch_first:
            raise ConfigError("Ordered dropout supports the plain CharLSTM (one direction, biases, no LSTM dropout).")
        self.hidden, self.layers = lstm.hidden_size, lstm.num_layers

    def widths(self) -> list[int]:
        return [self.hidden] * self.layers

    def _gate_rows(self, units: Tensor) -> Tensor:
        return torch.cat([g * self.hidden + units for g in range(4)])

    def forward(self, model: Any, x: Tensor, units: Units) -> Tensor:
        lstm = model.lstm
        out = model.embedding(x.long())
        for k in range(self.layers):
            u = units[k]
            rows = self._gate_rows(u)
            inp = units[k - 1] if k else None
            w_ih = _take(_take(getattr(lstm, f"weight_ih_l{k}"), 0, rows), 1, inp)
            w_hh = _take(_take(getattr(lstm, f"weight_hh_l{k}"), 0, rows), 1, u)
            b_ih = _take(getattr(lstm, f"bias_ih_l{k}"), 0, rows)
            b_hh = _take(getattr(lstm, f"bias_hh_l{k}"), 0, rows)
            zeros = out.new_zeros(1, out.shape[0], u.numel())
            # the kernel nn.LSTM itself calls, on the sliced weights
            weights = [w.contiguous() for w in (w_ih, w_hh, b_ih, b_hh)]
            out = torch._VF.lstm(  # type: ignore[attr-defined]
                out, (zeros, zeros), weights, True, 1, 0.0, model.training, False, True
            )[0]
        return F.linear(out[:, -1], _take(model.head.weight, 1, units[-1]), model.head.bias)

    def kept(self, units: Units) -> dict[str, tuple[Tensor | None, ...]]:
        result: dict[str, tuple[Tensor | None, ...]] = {"embedding.weight": (None, None)}
        for k in range(self.layers):
            rows = self._gate_rows(units[k])
            inp = units[k - 1] if k else None
            result |= {
                f"lstm.weight_ih_l{k}": (rows, inp),
                f"lstm.weight_hh_l{k}": (rows, units[k]),
                f"lstm.bias_ih_l{k}": (rows,),
                f"lstm.bias_hh_l{k}": (rows,),
            }
        result |= {"head.weight": (None, units[-1]), "head.bias": (None,)}
        return result


def _is_sequential_mlp(model: nn.Module) -> bool:
    seq = model.net if isinstance(model, MLP) else model
    return isinstance(seq, nn.Sequential) and all(isinstance(m, nn.Linear | nn.ReLU | nn.Flatten) for m in seq)


def od_architecture(model: nn.Module) -> ODArchitecture:
    """The OD description of ``model``, or a one-sentence refusal for a model OD does not support."""
    arch: ODArchitecture
    if isinstance(model, FemnistCNN):
        arch = FemnistCNNArchitecture(model)
    elif isinstance(model, SmallCNN):
        arch = SmallCNNArchitecture(model)
    elif isinstance(model, ResNet18GN):
        arch = ResNet18GNArchitecture(model)
    elif isinstance(model, CharLSTM):
        arch = CharLSTMArchitecture(model)
    elif _is_sequential_mlp(model):
        arch = SequentialMLPArchitecture(model)
    else:
        raise ConfigError(
            f"Ordered dropout has no sub-models of {type(model).__name__}; use model=mlp, digits_mlp, mnistfc, "
            "cnn, digits_cnn, fedavg_cnn, fjord_femnist_cnn, resnet18_gn, char_lstm or fjord_char_lstm."
        )
    if not arch.widths():
        raise ConfigError(
            f"{type(model).__name__} has no hidden layer, so every ordered-dropout width is the whole model; "
            "use a model with hidden layers (e.g. model=digits_mlp)."
        )
    return arch


def sub_model_indices(model: nn.Module, arch: ODArchitecture, units: Units) -> Tensor:
    """The flat-parameter index set (ascending, ``model.parameters()`` order) of the sub-model with ``units``."""
    kept = arch.kept(units)
    parts, offset = [], 0
    names = set()
    for name, param in model.named_parameters():
        if name not in kept:
            raise ValueError(f"{type(arch).__name__} does not describe parameter {name!r}.")
        names.add(name)
        dims = [_full(s) if k is None else k for k, s in zip(kept[name], param.shape, strict=True)]
        parts.append(offset + _product_indices(dims, param.shape))
        offset += param.numel()
    if names != set(kept):
        raise ValueError(f"{type(arch).__name__} describes parameters the model lacks: {sorted(set(kept) - names)}.")
    return torch.cat(parts)


def od_index_set(model: nn.Module, p: float, arch: ODArchitecture | None = None) -> Tensor:
    """Flat-parameter indices of F_p (OD's first ⌈p·K_l⌉ units of every droppable layer)."""
    arch = arch or od_architecture(model)
    return sub_model_indices(model, arch, ordered_units(arch.widths(), p))


def sub_model_macs(
    model: nn.Module, arch: ODArchitecture, units: Units, input_shape: Sequence[int], *, elementwise: bool = False
) -> int:
    """Multiply–accumulates per sample of the sub-model's convolutions and linear layers.

    Counted by ``torch.utils.flop_counter`` on one forward pass (FLOPs / 2); normalisation,
    activations, pooling and additions are not counted (the usual MAC convention). The LSTM
    kernel is invisible to that counter: a :class:`CharLSTM` is counted per time step (one
    character) by :func:`~fedlightning.metrics.inference_cost.lstm_step_macs`, its LSTM layers at
    the kept widths plus the output layer (``elementwise``: also biases and element-wise
    operations; only for a :class:`CharLSTM`). ``input_shape`` is then not used.
    """
    if isinstance(model, CharLSTM):
        return lstm_step_macs(
            input_size=model.lstm.input_size,
            hidden=[u.numel() for u in units],
            outputs=model.head.out_features,
            elementwise=elementwise,
        )
    if elementwise:
        raise ValueError("sub_model_macs counts element-wise operations only for a CharLSTM.")
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, *input_shape, device=next(model.parameters()).device)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        arch.forward(model, x, units)
    return counter.get_total_flops() // 2


class OrderedDropout(nn.Module):
    """A supported model that runs at any width: ``forward(x, p)`` is F_p(x) (p = 1: the model itself).

    Its parameters are the wrapped model's, in the same order (``flat_parameters`` agree).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.arch = od_architecture(model)

    def widths(self) -> list[int]:
        """K_l of every droppable unit group."""
        return self.arch.widths()

    def forward(self, x: Tensor, p: float = 1.0, units: Units | None = None) -> Tensor:
        """F_p(x), or the sub-model with explicit ``units``."""
        chosen = ordered_units(self.widths(), p) if units is None else units
        return self.arch.forward(self.model, x, chosen)

    def index_set(self, p: float) -> Tensor:
        """Flat-parameter indices of F_p."""
        return od_index_set(self.model, p, self.arch)

    def extra_repr(self) -> str:
        return f"widths={self.widths()}"

    def parameters_at(self, p: float) -> int:
        """|F_p|: parameters of the sub-model."""
        return int(self.index_set(p).numel())
