"""Zampling speed (arXiv 2503.14246): a training step and a federated round against FedAvg.

Part 1 (``--kernels``), the Q·z and Qᵀ·g kernels alone at m/n = 32, d = 10 on mnistfc
(m = 266,610, n = 8,331, 2.67 M non-zeros), one thread: the compiled row-layout kernels against
``torch.mv`` on the CSR layouts, the dense-index formulation (cols/vals of shape (m, d):
gather z, multiply, sum; backward by ``index_add_``/``bincount``), ``segment_reduce`` over the
CSC, and the incremental update (compiled, and ``index_add_`` over the padded column table)
and the free-column backward at several shares.

Part 2, one local step of the 784-300-100-10 MLP (mnistfc) at batch 128, forward + backward +
optimiser step, one torch thread:

* plain: the MLP with its own weights, SGD;
* zampling: sample z ~ Bernoulli(clip(s)), w = Q·z, functional forward, backward Qᵀ·g, Adam
  on s; m/n = 32, d = 10; with the fast path (incremental Q·z when few bits flipped,
  free-column backward) on the compiled kernels (the default on the CPU) and on ``torch.mv``
  (``backend="torch"``), and the reference path (``ZampledWeights(fast=False)``: full
  ``torch.mv`` products every step); p in the three states of :data:`STATES` (round 0 with
  nothing frozen, a client's first local epoch as trained, and after ~10 federated rounds).

Part 3, federated rounds through the engine (10 IID MNIST clients, ~5,400 samples each,
1 local epoch): FedAvg (batch 32, its default; and batch 128) against Federated Zampling
(batch 128, the paper's; with the three Q·z paths above). Each repetition
runs one round of every method in turn, each continuing from its own state (a fresh Trainer
per round, so every round is round index 0 for the random streams; p keeps polarising from
one repetition to the next).

Part 4 (``--s5 R``), the performance suite's S5 against S1 (R interleaved repetitions): S1 is
FedAvg on mnistfc, 10 IID MNIST clients, 1 local epoch, batch 32, SGD lr 0.05, with a
validation pass every round; S5 is Federated Zampling, m/n = 32, d = 10, at the same batch
size, whose validation pass also scores ``reports.zampling_evaluation.val_samples`` (20) sampled
networks, one by one (``networks_per_forward=1``) or batched (10 per forward, the default). Each repetition
times, for every candidate in turn, one round (training) and one validation pass; a round of
S5 is training + its validation.

Part 5 (``--s5-run R``), S5 against S1 along a run: one Trainer trains S5 for R rounds
(round indices 0 … R − 1, so p polarises as in a real run; no evaluation), and after each S5
round one S1 round (FedAvg, batch 32, its own module and a fresh Trainer) is timed in the same
process, so every S5 round has an S1 round of the same moment to compare with. It prints the
ratio per round, S5's frozen fraction of p, and the mean ratio over rounds 1–10, 11–20, ….
``--s5-autograd`` runs S5's client steps through autograd instead of by hand
(``local_execution=loop``), ``--s5-fused-adam`` gives its clients ``Adam(fused=True)``.

All timings interleave the candidates within every repetition and report medians:

    python benchmarks/zampling_speed.py --data-root ../shared/data --kernels --repeats 21 --rounds 12
    python benchmarks/zampling_speed.py --data-root ../shared/data --repeats 0 --rounds 0 --s5 5
    python benchmarks/zampling_speed.py --data-root ../shared/data --repeats 0 --rounds 0 --s5-run 30
    python benchmarks/zampling_speed.py --data-root ../shared/data --repeats 0 --rounds 0 --s5-run 40 --s5-autograd

Timings on a shared machine are noisy: compare the ratios printed at the end.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import time
from typing import Any

import lightning as L
import torch
from perf.trainers import bare_trainer  # benchmarks/ is sys.path[0]

from fedlightning.callbacks.zampling_evaluation import ZamplingEvaluation
from fedlightning.datamodules import IIDPartition, MNISTDataModule
from fedlightning.methods import FedAvg
from fedlightning.methods import zampling as zampling_method
from fedlightning.methods.zampling import Zampling, frozen_fraction
from fedlightning.models import build_model
from fedlightning.models.zampling import SparseQ, ZampledNetwork, ZampledWeights, row_fan_in, zampling_q
from fedlightning.models.zampling_estimators import probability_from_score
from fedlightning.sampling import FullParticipation

PATHS: dict[str, dict[str, Any]] = {
    "fast": {},  # the default: incremental Q·z and free-column Qᵀ·g, compiled kernels on the CPU
    "fast_torch": {"backend": "torch"},  # the same shortcuts on torch.mv / index_add_
    "reference": {"fast": False},  # full torch.mv products every step
}

# (name, share of p frozen at 0/1 at the start, Adam lr). "unfrozen" and "polarised" hold p
# (a tiny lr), so every repetition sees that state: round 0 with nothing frozen, the worst
# case, and the state after ~10 federated rounds. "round0" is a continuing run at the
# paper's lr 0.1 from p ~ U(0,1), as a client's first local epoch: its clip freezes
# coordinates within a few steps, so the timed steps (after 5 warm-up steps) are a mix.
STATES: tuple[tuple[str, float, float], ...] = (("unfrozen", 0.0, 1e-6), ("round0", 0.0, 0.1), ("polarised", 0.8, 1e-4))


def _interleaved_median_ms(fns: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median ms of each function, timed in turn within every repetition.

    Interleaving makes the ratios robust to the load drifting on a shared machine (each
    repetition sees about the same contention for every function).
    """
    for _ in range(5):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def _mnistfc_q() -> tuple[torch.nn.Module, SparseQ]:
    model = build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)
    return model, zampling_q(row_fan_in(model), n=266_610 // 32, d=10, seed=0)


def _polarised_p(n: int, frozen_share: float, gen: torch.Generator) -> torch.Tensor:
    """p ~ U(0,1), or on the 1/10 lattice with ``frozen_share`` of it rounded to exactly 0 or 1."""
    p = torch.rand(n, generator=gen)
    if frozen_share:
        p = torch.round(p * 10) / 10
        p = torch.where(torch.rand(n, generator=gen) < frozen_share, torch.round(p), p)
    return p


def kernel_benchmark(repeats: int) -> dict[str, float]:
    """Median ms of each Q·z / Qᵀ·g formulation (one torch thread)."""
    _, q = _mnistfc_q()
    m, n = q.m, q.n
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(n, generator=gen)
    z = torch.bernoulli(p, generator=gen)
    g = torch.randn(m, generator=gen)
    cols = q.cols.reshape(-1).contiguous()
    lengths = q.col_ptr[1:] - q.col_ptr[:-1]
    col_rows = q.col_rows.to(torch.int64)
    all_columns = torch.arange(n)
    g_ext = torch.cat([g, torch.zeros(1)])
    full_block = q.free_block(all_columns)
    fns: dict[str, Any] = {
        "fwd compiled rows (default on the CPU)": lambda: q.matvec(z),
        "fwd csr mv (torch.mv)": lambda: q.matvec(z, backend="torch"),
        "fwd csr @ z[:, None]": lambda: q.csr @ z.reshape(-1, 1),
        "fwd dense-index (vals * z[cols]).sum(1)": lambda: (q.vals * z[q.cols]).sum(1),
        "bwd compiled rows (default on the CPU)": lambda: q.rmatvec(g),
        "bwd csr-of-Qt mv (torch.mv)": lambda: torch.mv(q.csr_t, g),
        "bwd csr-of-Qt @ g[:, None]": lambda: q.rmatvec(g, backend="torch"),
        "bwd free-column CSR block, all columns": lambda: torch.mv(full_block, g_ext),
        "bwd dense-index index_add_": lambda: torch.zeros(n).index_add_(0, cols, (q.vals * g[:, None]).view(-1)),
        "bwd dense-index bincount(weights)": lambda: torch.bincount(cols, (q.vals * g[:, None]).view(-1), n),
        "bwd CSC segment_reduce": lambda: torch.segment_reduce(q.col_vals * g[col_rows], "sum", lengths=lengths),
    }
    if repeats <= 9:  # the transposed-CSR products take ~0.2 s each; time them only on short runs
        fns["fwd mv on transposed CSR of Qt"] = lambda: torch.mv(q.csr_t.t(), z)
    w = torch.zeros(m)
    for share in (0.02, 0.05, 0.1, 0.15, 0.2, 0.33):
        flips = torch.nonzero(torch.rand(n, generator=gen) < share).squeeze(1)
        coef = 1 - 2 * z[flips]  # +1 for 0 → 1, −1 for 1 → 0
        for backend in ("compiled", "torch"):
            fns[f"fwd incremental {backend} (copy w + flips), {100 * share:.0f}% flipped"] = (
                lambda flips=flips, coef=coef, backend=backend: q.add_columns_(w.clone(), flips, coef, backend=backend)
            )
    for share in (0.8, 0.6, 0.5, 0.2, 0.1, 0.05):
        free = torch.rand(n, generator=gen) < share
        columns = torch.nonzero(free).squeeze(1)
        block = q.free_block(columns)
        p = free.to(torch.float32) * 0.5  # 0.5 on the free columns, 0 (frozen) elsewhere
        fns[f"bwd free-column compiled gather (CSC), {100 * share:.0f}% free"] = lambda p=p: q.free_rmatvec(g, p)[0]
        fns[f"bwd free-column block, {100 * share:.0f}% free"] = lambda block=block: torch.mv(block, g_ext)
        fns[f"  (its rebuild, {100 * share:.0f}% free)"] = lambda columns=columns: q.free_block(columns)
    return _interleaved_median_ms(fns, repeats)


def step_benchmark(repeats: int) -> dict[str, float]:
    """Median ms of one training step: plain MLP vs Zampling (every path of PATHS, every state of STATES)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 1, 28, 28, generator=gen), torch.randint(0, 10, (128,), generator=gen)
    model, q = _mnistfc_q()
    sgd = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, nesterov=True)

    def plain() -> None:
        sgd.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        sgd.step()

    fns: dict[str, Any] = {"plain_ms": plain}
    all_weights: dict[str, ZampledWeights] = {}
    scores: dict[str, torch.Tensor] = {}
    net = ZampledNetwork(model)
    for state, frozen_share, lr in STATES:
        p0 = _polarised_p(q.n, frozen_share, gen)
        for path in PATHS:
            s = p0.clone().requires_grad_(True)
            adam = torch.optim.Adam([s], lr=lr)
            weights = ZampledWeights(q, **PATHS[path])
            mask_gen = torch.Generator().manual_seed(1)

            def step(
                s: torch.Tensor = s,
                adam: torch.optim.Optimizer = adam,
                weights: ZampledWeights = weights,
                mask_gen: torch.Generator = mask_gen,
            ) -> None:
                p = probability_from_score(s, "zampling")
                w = weights(p, torch.bernoulli(p.detach(), generator=mask_gen))
                loss = torch.nn.functional.cross_entropy(net.forward(x, w), y)
                adam.zero_grad(set_to_none=True)
                loss.backward()
                adam.step()

            label = f"zampling_{state}_{path}_ms"
            fns[label] = step
            all_weights[label] = weights
            scores[label] = s
    results = _interleaved_median_ms(fns, repeats)
    for label, weights in all_weights.items():
        done = max(1, weights.stats["incremental"] + weights.stats["full"])
        results[label.replace("_ms", "_incremental_share")] = weights.stats["incremental"] / done
        results[label.replace("_ms", "_flipped_share")] = weights.stats["flipped"] / max(
            1, weights.stats["incremental"] * weights.q.n
        )
        final_p = probability_from_score(scores[label].detach(), "zampling")
        results[label.replace("_ms", "_frozen_after")] = frozen_fraction(final_p)
    return results


class _Timer(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, *args: object) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, *args: object) -> None:
        self.times.append(time.perf_counter() - self.start)


def _one_round(module: L.LightningModule) -> float:
    """Seconds of one federated round (the training batch) of ``module`` under a fresh Trainer.

    A module with a ``_speed_path`` (a key of :data:`PATHS`) runs its round with the method's
    ``ZampledWeights`` swapped for ``ZampledWeights(**PATHS[path])``.
    """
    path = getattr(module, "_speed_path", None)
    if path is not None:
        original = zampling_method.ZampledWeights
        zampling_method.ZampledWeights = functools.partial(original, **PATHS[path])  # type: ignore[misc]
        try:
            return _one_round_timed(module)
        finally:
            zampling_method.ZampledWeights = original  # type: ignore[misc]
    return _one_round_timed(module)


def _round_trainer(rounds: int, callback: L.Callback) -> L.Trainer:
    """A bare Trainer for ``rounds`` full-participation rounds without validation, with ``callback``."""
    return bare_trainer(callbacks=[FullParticipation(), callback], rounds=rounds)


def _one_round_timed(module: L.LightningModule) -> float:
    timer = _Timer()
    _round_trainer(1, timer).fit(module)
    return timer.times[-1]


def round_benchmark(data_root: str, rounds: int) -> dict[str, list[float]]:
    """Round times (s) of FedAvg and Federated Zampling through the engine, interleaved."""
    dm = MNISTDataModule(root=data_root, num_clients=10, partition=IIDPartition())
    dm.setup("fit")

    def mnistfc() -> torch.nn.Module:
        return build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)

    # a partial, as the command's config gives: FedAvg's clients then take the fused local step
    sgd = functools.partial(torch.optim.SGD, lr=0.03, momentum=0.9, nesterov=True)

    modules: dict[str, L.LightningModule] = {
        "fedavg_b32": FedAvg(model=mnistfc(), datamodule=dm, client_optimizer=sgd),
        "fedavg_b128": FedAvg(model=mnistfc(), datamodule=dm, client_optimizer=sgd, batch_size=128),
    }
    for path in PATHS:
        module = Zampling(model=mnistfc(), datamodule=dm, d=10, compression=32, batch_size=128)
        module._speed_path = path
        modules[f"zampling_b128_{path}"] = module
    out: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(rounds):
        for name, module in modules.items():
            out[name].append(_one_round(module))
    zampling = modules["zampling_b128_fast"]
    assert isinstance(zampling, Zampling)
    out["zampling_frozen_fraction_after"] = [frozen_fraction(zampling.p.detach())]
    return out


def _one_validation(module: L.LightningModule, *reports: L.Callback) -> float:
    """Seconds of one validation pass of ``module`` (its expected network, and with ``reports`` for the
    Zampling family the sampled networks of :class:`~fedlightning.callbacks.zampling_evaluation.ZamplingEvaluation`)."""
    trainer = bare_trainer(callbacks=reports)
    start = time.perf_counter()
    trainer.validate(module, verbose=False)
    return time.perf_counter() - start


def s5_benchmark(data_root: str, repetitions: int) -> dict[str, list[float]]:
    """S1 (FedAvg, batch 32) vs S5 (Federated Zampling m/n = 32, d = 10, batch 32): seconds of
    one round and of one validation pass each, interleaved."""
    dm = MNISTDataModule(root=data_root, num_clients=10, partition=IIDPartition())
    dm.setup("fit")

    def mnistfc() -> torch.nn.Module:
        return build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)

    sgd = functools.partial(torch.optim.SGD, lr=0.05)  # as the command builds it: fused local steps

    modules: dict[str, L.LightningModule] = {
        "S1": FedAvg(model=mnistfc(), datamodule=dm, client_optimizer=sgd, batch_size=32),
        "S5": Zampling(model=mnistfc(), datamodule=dm, d=10, compression=32, batch_size=32),
    }
    s5 = modules["S5"]
    assert isinstance(s5, Zampling)
    evaluation = ZamplingEvaluation()  # the defaults of reports.zampling_evaluation, as the runner attaches it
    one_by_one = evaluation.networks_per_forward
    out: dict[str, list[float]] = {
        key: [] for key in ("S1_train", "S1_val", "S5_train", "S5_val_one_by_one", "S5_val_batched")
    }
    for _ in range(repetitions):
        out["S1_train"].append(_one_round(modules["S1"]))
        out["S1_val"].append(_one_validation(modules["S1"]))
        out["S5_train"].append(_one_round(s5))
        for label, per_forward in (("S5_val_one_by_one", 1), ("S5_val_batched", one_by_one)):
            evaluation.networks_per_forward = per_forward
            out[label].append(_one_validation(s5, evaluation))
        evaluation.networks_per_forward = one_by_one
    out["S5_frozen_fraction_after"] = [frozen_fraction(s5.p.detach())]
    return out


class _InterleavedS1(L.Callback):
    """Times each S5 round of the run it is attached to, then one S1 round of ``s1``."""

    def __init__(self, s1: L.LightningModule) -> None:
        self.s1 = s1
        self.s5_times: list[float] = []
        self.s1_times: list[float] = []
        self.frozen: list[float] = []

    def on_train_batch_start(self, *args: object) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        self.s5_times.append(time.perf_counter() - self.start)
        assert isinstance(pl_module, Zampling)
        self.frozen.append(frozen_fraction(pl_module.p.detach()))
        self.s1_times.append(_one_round(self.s1))
        gc.freeze()  # the S1 trainer's end of training unfroze the collector; a real run keeps it frozen
        r, a, b = len(self.s5_times), self.s5_times[-1], self.s1_times[-1]
        print(f"round {r}: S5 {a:.2f} s, S1 {b:.2f} s, S5/S1 {a / b:.2f}, frozen {self.frozen[-1]:.3f}", flush=True)


def s5_run_benchmark(
    data_root: str, rounds: int, *, autograd: bool = False, fused_adam: bool = False
) -> dict[str, list[float]]:
    """S5 trained for ``rounds`` rounds in one run, an S1 round timed after each (seconds).

    ``autograd``: S5's clients step through autograd (``local_execution=loop``) instead of by
    hand. ``fused_adam``: their Adam is ``torch.optim.Adam(..., fused=True)`` (one kernel per
    step; the same update up to float rounding) instead of the default implementation.
    """
    dm = MNISTDataModule(root=data_root, num_clients=10, partition=IIDPartition())
    dm.setup("fit")

    def mnistfc() -> torch.nn.Module:
        return build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)

    sgd = functools.partial(torch.optim.SGD, lr=0.05)  # as the command builds it: fused local steps
    s1 = FedAvg(model=mnistfc(), datamodule=dm, client_optimizer=sgd, batch_size=32)
    adam = functools.partial(torch.optim.Adam, lr=0.1, fused=True) if fused_adam else None
    s5 = Zampling(
        model=mnistfc(),
        datamodule=dm,
        d=10,
        compression=32,
        batch_size=32,
        client_optimizer=adam,
        local_execution="loop" if autograd else "auto",
    )
    _one_round(s1)  # warm-up: the first S1 round pays one-time costs of the process
    interleave = _InterleavedS1(s1)
    _round_trainer(rounds, interleave).fit(s5)
    return {"S5": interleave.s5_times, "S1": interleave.s1_times, "frozen": interleave.frozen}


def s5_run_report(times: dict[str, list[float]]) -> None:
    """Print the per-round S5 / S1 ratios along the run and their means over blocks of 10 rounds."""
    ratios = [a / b for a, b in zip(times["S5"], times["S1"], strict=True)]
    print("round  S5 s    S1 s    S5/S1  frozen share of p after the round")
    for r, (a, b, q, f) in enumerate(zip(times["S5"], times["S1"], ratios, times["frozen"], strict=True), start=1):
        print(f"{r:5d}  {a:6.2f}  {b:6.2f}  {q:5.2f}  {f:.3f}")
    for start in range(0, len(ratios), 10):
        block = ratios[start : start + 10]
        s5 = sum(times["S5"][start : start + 10])
        s1 = sum(times["S1"][start : start + 10])
        print(
            f"rounds {start + 1}-{start + len(block)}: median ratio {statistics.median(block):.2f}, "
            f"ratio of sums {s5 / s1:.2f}, max {max(block):.2f}, rounds at most 2x: {sum(q <= 2 for q in block)}"
        )
    print(f"all {len(ratios)} rounds: ratio of sums {sum(times['S5']) / sum(times['S1']):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved round repetitions (0: skip)")
    parser.add_argument("--repeats", type=int, default=21, help="interleaved step repetitions")
    parser.add_argument("--kernels", action="store_true", help="also time the Q·z / Qᵀ·g kernels alone")
    parser.add_argument("--s5", type=int, default=0, help="interleaved S5-vs-S1 repetitions (0: skip)")
    parser.add_argument("--s5-run", type=int, default=0, help="S5 rounds of one run, an S1 round after each (0: skip)")
    parser.add_argument("--s5-autograd", action="store_true", help="--s5-run with S5's local steps through autograd")
    parser.add_argument("--s5-fused-adam", action="store_true", help="--s5-run with S5's Adam fused=True")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.s5 > 0:
        s5_report(s5_benchmark(args.data_root, args.s5))
    if args.s5_run > 0:
        s5_run_report(
            s5_run_benchmark(args.data_root, args.s5_run, autograd=args.s5_autograd, fused_adam=args.s5_fused_adam)
        )
    if args.kernels:
        print("kernels, m/n = 32, d = 10, median ms:")
        for name, ms in kernel_benchmark(args.repeats).items():
            print(f"  {name:48s} {ms:7.2f}")
    if args.repeats < 1:
        return
    steps = step_benchmark(args.repeats)
    plain = steps["plain_ms"]
    print(f"plain mnistfc step, batch 128: {plain:.2f} ms  ({args.repeats} interleaved repetitions, medians)")
    for state, _, _ in STATES:
        for path in PATHS:
            key = f"zampling_{state}_{path}"
            ms = steps[f"{key}_ms"]
            print(
                f"zampling step, {state:9s} p, {path:10s} path: {ms:6.2f} ms  ratio {ms / plain:.2f}x"
                f"  (incremental Q·z on {100 * steps[key + '_incremental_share']:.0f}% of steps,"
                f" {100 * steps[key + '_flipped_share']:.1f}% of bits flipped on those;"
                f" {100 * steps[key + '_frozen_after']:.0f}% of p frozen at the end)"
            )
    if args.rounds < 1:
        return
    rounds = round_benchmark(args.data_root, args.rounds)
    base = statistics.median(rounds["fedavg_b32"])
    b128 = statistics.median(rounds["fedavg_b128"])
    print(f"federated rounds ({args.rounds} interleaved repetitions), seconds:")
    for key in ("fedavg_b32", "fedavg_b128", *(f"zampling_b128_{path}" for path in PATHS)):
        times = rounds[key]
        med = statistics.median(times)
        print(
            f"  {key:24s} median {med:6.2f}  ratio to fedavg_b32 {med / base:.2f}x"
            f"  to fedavg_b128 {med / b128:.2f}x  all {[round(t, 2) for t in times]}"
        )
    print(f"  zampling frozen fraction after the last round: {rounds['zampling_frozen_fraction_after'][0]:.3f}")


def s5_report(times: dict[str, list[float]]) -> None:
    """Print the S5-vs-S1 medians and ratios (a round = training + one validation pass)."""
    med = {key: statistics.median(values) for key, values in times.items()}
    for key, values in times.items():
        print(f"  {key:24s} median {med[key]:7.3f} s  all {[round(t, 3) for t in values]}")
    s1 = med["S1_train"] + med["S1_val"]
    s1_rounds = [t + v for t, v in zip(times["S1_train"], times["S1_val"], strict=True)]
    for label in ("S5_val_one_by_one", "S5_val_batched"):
        s5_rounds = [t + v for t, v in zip(times["S5_train"], times[label], strict=True)]
        per_rep = [round(a / b, 2) for a, b in zip(s5_rounds, s1_rounds, strict=True)]
        total = med["S5_train"] + med[label]
        print(f"  S5 round with {label[7:]:11s} evaluation: {total:7.3f} s = {total / s1:.2f}x S1 ({s1:.3f} s)")
        print(f"    per repetition (S5 / S1 of the same repetition): {per_rep}")
    print(f"  validation speed-up, batched vs one by one: {med['S5_val_one_by_one'] / med['S5_val_batched']:.2f}x")


if __name__ == "__main__":
    main()
