"""Ordered dropout: nested sub-models F_p, their index sets, Table 7.2 and Theorem 7.4.1 (arXiv 2207.00392, ch. 7)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlightning.errors import ConfigError
from fedlightning.federated.params import assign_flat_, flat_parameters
from fedlightning.models.char_lstm import CharLSTM
from fedlightning.models.mlp import MLP
from fedlightning.models.ordered_dropout import (
    OrderedDropout,
    _group_norm,
    od_architecture,
    od_width,
    ordered_units,
    random_units,
    sub_model_macs,
)
from fedlightning.models.presets import build_model

WIDTHS = (0.2, 0.4, 0.6, 0.8, 1.0)
CASES = {
    "digits_mlp": ((1, 8, 8), 10, {}),
    "digits_cnn": ((1, 8, 8), 10, {}),
    "fedavg_cnn": ((1, 28, 28), 62, {"channels": (8, 16), "hidden": 32}),
    "fjord_femnist_cnn": ((1, 28, 28), 62, {}),
    "resnet18_gn": ((3, 32, 32), 10, {"width": 8}),
    "char_lstm": ((12,), 30, {"hidden": 20}),
}


def _model_and_input(name: str) -> tuple[nn.Module, torch.Tensor]:
    shape, classes, options = CASES[name]
    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=classes, **options)
    x = torch.randint(0, classes, (3, *shape)) if name == "char_lstm" else torch.randn(3, *shape)
    return model, x


def test_od_width_is_the_ceiling_without_float_noise() -> None:
    assert [od_width(p, 5) for p in WIDTHS] == [1, 2, 3, 4, 5]
    assert [od_width(p, 10) for p in (0.1, 0.3, 0.6, 0.7)] == [1, 3, 6, 7]
    assert [od_width(p, 512) for p in WIDTHS] == [103, 205, 308, 410, 512]
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        od_width(0.0, 5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_full_width_is_the_model_and_sub_models_are_nested_and_use_only_their_slice(name: str) -> None:
    model, x = _model_and_input(name)
    od = OrderedDropout(model)
    assert torch.allclose(od(x, 1.0), model(x), atol=1e-5)
    sets = [set(od.index_set(p).tolist()) for p in WIDTHS]
    assert all(a < b for a, b in itertools.pairwise(sets))  # F_0.2 ⊂ F_0.4 ⊂ … ⊂ F_1, strictly
    assert len(sets[-1]) == sum(q.numel() for q in model.parameters())
    flat = flat_parameters(model)
    for p in WIDTHS[:-1]:
        idx = od.index_set(p)
        assert torch.equal(idx, idx.sort().values)
        # F_p depends on its slice only: other coordinates scrambled, same output ...
        other = build_model(name, input_shape=CASES[name][0], num_classes=CASES[name][1], **CASES[name][2])
        scrambled = torch.randn_like(flat) * 3
        scrambled[idx] = flat[idx]
        assign_flat_(other, scrambled)
        assert torch.allclose(OrderedDropout(other)(x, p), od(x, p), atol=1e-5)
        # ... and its gradient is zero outside the slice (and not zero inside).
        model.zero_grad()
        od(x, p).square().sum().backward()
        grad = torch.cat(
            [q.grad.reshape(-1) if q.grad is not None else torch.zeros(q.numel()) for q in model.parameters()]
        )
        outside = torch.ones_like(grad, dtype=torch.bool)
        outside[idx] = False
        assert grad[outside].abs().max() == 0 and grad[idx].abs().max() > 0


def test_mlp_sub_model_equals_the_narrow_mlp_with_the_first_units() -> None:
    torch.manual_seed(0)
    big, small = MLP(in_features=6, hidden=[10, 5], num_classes=3), MLP(in_features=6, hidden=[4, 2], num_classes=3)
    b, s = big.net, small.net
    with torch.no_grad():
        s[1].weight.copy_(b[1].weight[:4]), s[1].bias.copy_(b[1].bias[:4])
        s[3].weight.copy_(b[3].weight[:2, :4]), s[3].bias.copy_(b[3].bias[:2])
        s[5].weight.copy_(b[5].weight[:, :2]), s[5].bias.copy_(b[5].bias)
    x = torch.randn(7, 6)
    assert OrderedDropout(big).widths() == [10, 5]
    assert torch.allclose(OrderedDropout(big)(x, 0.4), small(x), atol=1e-6)  # ⌈0.4·10⌉ = 4, ⌈0.4·5⌉ = 2


def test_lstm_sub_model_equals_a_narrow_lstm_with_every_gates_first_units() -> None:
    torch.manual_seed(0)
    big, small = CharLSTM(vocab_size=11, hidden=10), CharLSTM(vocab_size=11, hidden=4)
    h = 4
    rows = torch.cat([g * 10 + torch.arange(h) for g in range(4)])
    with torch.no_grad():
        small.embedding.weight.copy_(big.embedding.weight)
        for k in range(2):
            w_ih = getattr(big.lstm, f"weight_ih_l{k}")[rows]
            getattr(small.lstm, f"weight_ih_l{k}").copy_(w_ih if k == 0 else w_ih[:, :h])
            getattr(small.lstm, f"weight_hh_l{k}").copy_(getattr(big.lstm, f"weight_hh_l{k}")[rows][:, :h])
            getattr(small.lstm, f"bias_ih_l{k}").copy_(getattr(big.lstm, f"bias_ih_l{k}")[rows])
            getattr(small.lstm, f"bias_hh_l{k}").copy_(getattr(big.lstm, f"bias_hh_l{k}")[rows])
        small.head.weight.copy_(big.head.weight[:, :h]), small.head.bias.copy_(big.head.bias)
    x = torch.randint(0, 11, (5, 9))
    assert torch.allclose(OrderedDropout(big)(x, 0.4), small(x), atol=1e-5)
    assert OrderedDropout(big).parameters_at(0.4) == sum(q.numel() for q in small.parameters())


def test_group_norm_keeps_each_channels_full_model_group_and_normalises_a_partial_group_over_its_channels() -> None:
    torch.manual_seed(0)
    norm = nn.GroupNorm(2, 64)  # groups of 32 channels
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5), norm.bias.uniform_(-1, 1)
    x = torch.randn(2, 40, 3, 3)
    expected = torch.cat(
        [
            F.group_norm(x[:, :32], 1, norm.weight[:32], norm.bias[:32], norm.eps),
            F.group_norm(x[:, 32:], 1, norm.weight[32:40], norm.bias[32:40], norm.eps),
        ],
        dim=1,
    )
    assert torch.allclose(_group_norm(x, norm, torch.arange(40)), expected, atol=1e-5)
    x13 = x[:, :13]
    one_group = F.group_norm(x13, 1, norm.weight[:13], norm.bias[:13], norm.eps)  # ⌈0.2·64⌉ = 13: one partial group
    assert torch.allclose(_group_norm(x13, norm, torch.arange(13)), one_group, atol=1e-5)
    picked = torch.tensor([1, 5, 33, 60])  # random dropout: groups {1, 5} and {33, 60}
    xs = torch.randn(2, 4, 3, 3)
    w, b = norm.weight[picked], norm.bias[picked]
    manual = torch.cat(
        [F.group_norm(xs[:, :2], 1, w[:2], b[:2], norm.eps), F.group_norm(xs[:, 2:], 1, w[2:], b[2:], norm.eps)], 1
    )
    assert torch.allclose(_group_norm(xs, norm, picked), manual, atol=1e-5)


def test_random_units_keep_the_inner_count_inside_the_outer_prefix() -> None:
    gen = torch.Generator().manual_seed(0)
    units = random_units([10, 64], outer=0.8, inner=0.6, generator=gen)
    assert [u.numel() for u in units] == [6, 39]
    assert all(
        torch.equal(u, u.sort().values) and int(u.max()) < od_width(0.8, k)
        for u, k in zip(units, [10, 64], strict=True)
    )
    assert [u.tolist() for u in ordered_units([10, 64], 0.2)] == [[0, 1], list(range(13))]


def test_table_7_2_resnet18_parameters_and_macs_per_width() -> None:
    """Thesis Table 7.2 (CIFAR-10 ResNet-18): MACs within 5 %; parameters as printed (one significant figure)."""
    model = build_model("resnet18_gn", input_shape=(3, 32, 32), num_classes=10)
    od = OrderedDropout(model)
    table_params = [456e3, 2e6, 4e6, 7e6, 11e6]
    table_macs = [23e6, 91e6, 203e6, 360e6, 555e6]
    for p, params, macs in zip(WIDTHS, table_params, table_macs, strict=True):
        counted = od.parameters_at(p)
        measured = sub_model_macs(model, od.arch, ordered_units(od.widths(), p), (3, 32, 32))
        assert abs(measured - macs) <= 0.05 * macs, (p, measured)
        if p == 0.2:  # printed as 456K: within 5 %
            assert abs(counted - params) <= 0.05 * params, counted
        else:  # printed to one (p = 1: two) significant figures
            assert float(f"{counted:.{2 if p == 1.0 else 1}g}") == params, (p, counted)


def test_theorem_7_4_1_ordered_dropout_on_a_linear_net_recovers_the_truncated_svd_at_every_width() -> None:
    """A 2-layer linear net trained with OD (p uniform over {b/K}) on y = Ax gives F_p = A_b, b = ⌈pK⌉."""
    k = 5
    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(k, k, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(k, k, generator=gen, dtype=torch.float64))
    a = u @ torch.diag(torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0], dtype=torch.float64)) @ v.T
    n = 1000
    z = torch.randn(n, k, generator=gen, dtype=torch.float64)
    x = z / z.norm(dim=1, keepdim=True) * torch.rand(n, 1, generator=gen, dtype=torch.float64) ** (1 / k)
    # Uniform-ball sample with its second moment made exactly I/(K+2), the population value.
    x = x @ torch.linalg.inv(torch.linalg.cholesky(x.T @ x / n)).T / math.sqrt(k + 2)
    x, y = x.float(), (x @ a.T).float()
    torch.manual_seed(0)
    net = OrderedDropout(nn.Sequential(nn.Linear(k, k, bias=False), nn.Linear(k, k, bias=False)))
    steps = 1500
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in range(steps):
        p = (int(torch.randint(k, (1,), generator=gen)) + 1) / k
        loss = (net(x, p) - y).square().sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    us, s, vh = torch.linalg.svd(a)
    w1, w2 = net.model[0].weight.detach().double(), net.model[1].weight.detach().double()
    for b in range(1, k + 1):
        best_rank_b = us[:, :b] @ torch.diag(s[:b]) @ vh[:b]
        assert torch.linalg.norm(w2[:, :b] @ w1[:b] - best_rank_b) <= 1e-3 * torch.linalg.norm(best_rank_b), b


@pytest.mark.parametrize("name", ["logreg", "conv4"])
def test_models_without_ordered_dropout_support_are_refused_in_one_sentence(name: str) -> None:
    model = build_model(name, input_shape=(1, 28, 28), num_classes=10)
    with pytest.raises(ConfigError) as caught:
        od_architecture(model)
    assert "\n" not in str(caught.value) and str(caught.value).endswith(".")


def _within(measured: float, printed: float, tolerance: float = 0.05) -> bool:
    return abs(measured - printed) <= tolerance * printed


def test_table_7_2_femnist_cnn_parameters_and_macs_per_width_within_5_percent() -> None:
    """Thesis Table 7.2 (FEMNIST CNN): every parameter and MAC entry within 5 % for model=fjord_femnist_cnn."""
    model = build_model("fjord_femnist_cnn", input_shape=(1, 28, 28), num_classes=62)
    od = OrderedDropout(model)
    assert od.widths() == [20, 36]
    table_params = [5e3, 10e3, 15e3, 20e3, 26e3]
    table_macs = [47e3, 120e3, 218e3, 342e3, 491e3]
    for p, params, macs in zip(WIDTHS, table_params, table_macs, strict=True):
        measured = sub_model_macs(model, od.arch, ordered_units(od.widths(), p), (1, 28, 28))
        assert _within(od.parameters_at(p), params), (p, od.parameters_at(p))
        assert _within(measured, macs), (p, measured)


def test_femnist_cnn_counts_by_hand_at_p_0_2_and_1() -> None:
    """conv 3×3 (28×28 out) → pool → conv 3×3 stride 2 (7×7 out) → pool (3×3) → linear to 62."""
    model = build_model("fjord_femnist_cnn", input_shape=(1, 28, 28), num_classes=62)
    od = OrderedDropout(model)
    # p = 1: 20 and 36 channels
    assert od.parameters_at(1.0) == (20 * 9 + 20) + (36 * 20 * 9 + 36) + (36 * 9 * 62 + 62) == 26_866
    full = sub_model_macs(model, od.arch, ordered_units(od.widths(), 1.0), (1, 28, 28))
    assert full == 20 * 9 * 28 * 28 + 36 * 20 * 9 * 7 * 7 + 36 * 9 * 62 == 478_728
    # p = 0.2: ⌈0.2·20⌉ = 4 and ⌈0.2·36⌉ = 8 channels
    assert od.parameters_at(0.2) == (4 * 9 + 4) + (8 * 4 * 9 + 8) + (8 * 9 * 62 + 62) == 4_862
    small = sub_model_macs(model, od.arch, ordered_units(od.widths(), 0.2), (1, 28, 28))
    assert small == 4 * 9 * 28 * 28 + 8 * 4 * 9 * 7 * 7 + 8 * 9 * 62 == 46_800


def test_femnist_cnn_sub_model_equals_the_narrow_cnn_with_the_first_channels() -> None:
    torch.manual_seed(0)
    big = build_model("fjord_femnist_cnn", input_shape=(1, 28, 28), num_classes=62)
    small = build_model("fjord_femnist_cnn", input_shape=(1, 28, 28), num_classes=62, channels=[8, 15])
    c1, c2 = 8, 15  # ⌈0.4·20⌉, ⌈0.4·36⌉
    fc_in = (torch.arange(c2)[:, None] * 9 + torch.arange(9)).reshape(-1)
    with torch.no_grad():
        (
            small.features[0].weight.copy_(big.features[0].weight[:c1]),
            small.features[0].bias.copy_(big.features[0].bias[:c1]),
        )
        small.features[3].weight.copy_(big.features[3].weight[:c2, :c1])
        small.features[3].bias.copy_(big.features[3].bias[:c2])
        small.classifier[1].weight.copy_(big.classifier[1].weight[:, fc_in])
        small.classifier[1].bias.copy_(big.classifier[1].bias)
    x = torch.randn(3, 1, 28, 28)
    assert torch.allclose(OrderedDropout(big)(x, 0.4), small(x), atol=1e-5)
    assert OrderedDropout(big).parameters_at(0.4) == sum(q.numel() for q in small.parameters())


def test_table_7_2_shakespeare_rnn_parameters_and_macs_per_width_within_5_percent() -> None:
    """Thesis Table 7.2 (Shakespeare RNN), model=fjord_char_lstm over the 90 ids of data=shakespeare.

    Parameters within 5 % at every width; MACs within 5 % at every width once biases and the
    element-wise operations count; matrix products alone are within 5 % for p ≥ 0.4 and 6.0 %
    below the printed 12K at p = 0.2.
    """
    model = build_model("fjord_char_lstm", input_shape=(80,), num_classes=90)
    od = OrderedDropout(model)
    assert od.widths() == [128, 128]
    table_params = [12e3, 40e3, 82e3, 142e3, 214e3]
    table_macs = [12e3, 40e3, 83e3, 143e3, 216e3]
    for p, params, macs in zip(WIDTHS, table_params, table_macs, strict=True):
        units = ordered_units(od.widths(), p)
        assert _within(od.parameters_at(p), params), (p, od.parameters_at(p))
        assert _within(sub_model_macs(model, od.arch, units, (80,), elementwise=True), macs), p
        products = sub_model_macs(model, od.arch, units, (80,))
        assert _within(products, macs) == (p > 0.2), (p, products)
    # p = 0.2: 26 units per layer; 4 gates × (input + hidden) × hidden per layer, then the output layer.
    at_02 = sub_model_macs(model, od.arch, ordered_units(od.widths(), 0.2), (80,))
    assert at_02 == 4 * 26 * (8 + 26) + 4 * 26 * (26 + 26) + 26 * 90 == 11_284
    assert (12_000 - at_02) / 12_000 == pytest.approx(0.0597, abs=1e-4)


def test_lstm_step_macs_by_hand_and_against_the_flop_counter_on_an_unrolled_step() -> None:
    """4·(in + h)·h per layer and step plus the output layer; the same as the mm FLOPs / 2 of one step."""
    from torch.utils.flop_counter import FlopCounterMode

    from fedlightning.metrics.inference_cost import lstm_step_macs

    assert lstm_step_macs(input_size=8, hidden=[128, 128], outputs=90) == 4 * 128 * 136 + 4 * 128 * 256 + 128 * 90
    assert lstm_step_macs(input_size=8, hidden=[128, 128], outputs=90) == 212_224
    assert lstm_step_macs(input_size=3, hidden=[5, 2], outputs=7, elementwise=True) == (
        4 * 5 * 8 + 16 * 5 + 4 * 2 * 7 + 16 * 2 + 2 * 7 + 7
    )
    torch.manual_seed(0)
    model = CharLSTM(vocab_size=11, embed_dim=3, hidden=6, num_layers=2)
    od = OrderedDropout(model)
    units = ordered_units(od.widths(), 0.5)  # 3 units per layer
    kept = od.arch.kept(units)
    named = dict(model.named_parameters())

    def piece(name: str) -> torch.Tensor:
        w = named[name]
        for dim, idx in enumerate(kept[name]):
            w = w if idx is None else w.index_select(dim, idx)
        return w

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:  # one time step, written out with the sub-model's weights
        x, h = model.embedding(torch.tensor([4])), torch.zeros(1, 3)
        for k in range(2):
            x = F.linear(x, piece(f"lstm.weight_ih_l{k}")) + F.linear(h, piece(f"lstm.weight_hh_l{k}"))
            x = x[:, :3]  # stands in for the gates' output h_k (the products are what is counted)
        F.linear(x, piece("head.weight"))
    assert sub_model_macs(model, od.arch, units, (9,)) == counter.get_total_flops() // 2
    assert sub_model_macs(model, od.arch, units, (9,)) == 4 * 3 * (3 + 3) + 4 * 3 * (3 + 3) + 3 * 11 == 177
    with pytest.raises(ValueError, match="only for a CharLSTM"):
        sub_model_macs(
            nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)), od.arch, units, (2,), elementwise=True
        )
