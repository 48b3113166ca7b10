"""Per-client overhead of a small-client round (workload S2): the engine against a plain loop.

S2: MNIST ``mnistfc``, 1,000 IID clients × 60 samples (``val_fraction=0``), 100 clients per
round drawn uniformly, 1 local epoch, batch 10, plain SGD lr 0.05, one torch thread, the
test set evaluated after every round. Every arm trains 100 clients of 60 samples a round on
the engine's batch schedules (the plain arms draw their cohort with their own seed; all
clients have the same size, so the work is the same); the plain loop adds the cohort's
weighted mean and one test-set pass in batches of 1,024. The engine's per-client overhead is
(engine round − plain round) / 100. Arms:
``peer`` (the suite's plain peer, ``benchmarks/perf/systems/plain_loop.py``, on these
batches: no flat upload, float32 sums in place); ``peer_fused`` (the same, each step taken by
:func:`fedlightning.federated.local.fused.fused_sgd_step_`); ``plain``; ``engine`` (``FedAvg``
under a bare ``Trainer``: no logger, checkpoints or accountant; its steps fused, as
``local_execution=fused`` does); ``engine_autograd`` (the same with ``local_execution=loop``);
``engine_vectorised`` (the same with ``local_execution=vectorised``: the share at once, sent and
folded in bulk);
``cli`` (the config the
``fedlightning`` command composes for S2, run through :func:`fedlightning.run.run` with its
loggers and callbacks). ``cli:A;B`` is the ``cli`` arm with the overrides A and B added, to
find which part of the command costs what.

    python benchmarks/lean_round.py --data-root ../shared/data --rounds 6 --repeats 3
    python benchmarks/lean_round.py --data-root ../shared/data --rounds 4 --repeats 4 --arms peer,plain,engine,cli
    python benchmarks/lean_round.py --data-root ../shared/data --arms "engine,cli,cli:logger=none"
    python benchmarks/lean_round.py --data-root ../shared/data --rounds 4 --profile s2.prof

The arms run in turn, repetition after repetition, so machine load hits them alike; the first
round of each run (start-up, first-touch allocations) is not counted.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import lightning as L
import torch
from perf.trainers import bare_trainer  # benchmarks/ is sys.path[0]

from fedlightning.datamodules import IIDPartition, MNISTDataModule
from fedlightning.federated.batches import local_batches
from fedlightning.federated.local.fused import fused_sgd_step_, linear_chain, plain_sgd_rates
from fedlightning.federated.params import assign_flat_, flat_parameters
from fedlightning.federated.rng import torch_generator
from fedlightning.methods import FedAvg
from fedlightning.models import build_model
from fedlightning.sampling import UniformSampler

CLIENTS, COHORT, BATCH, LR = 1000, 100, 10, 0.05
NAMES = "peer, peer_fused, plain, engine, engine_autograd, engine_vectorised, cli, cli:A;B"


def datamodule(root: str) -> MNISTDataModule:
    dm = MNISTDataModule(root=root, num_clients=CLIENTS, partition=IIDPartition(), val_fraction=0.0)
    dm.setup("fit")
    return dm


def cohort_of(round_idx: int) -> list[int]:
    """The round's 100 clients (the same for every arm)."""
    return torch.randperm(CLIENTS, generator=torch.Generator().manual_seed(round_idx))[:COHORT].tolist()


def local_epoch(client: torch.nn.Module, dm: MNISTDataModule, cid: int, round_idx: int, fused: bool = False) -> int:
    """One epoch of plain SGD on client ``cid``'s batches (the engine's schedule); its sample count.

    ``fused``: each step by :func:`~fedlightning.federated.local.fused.fused_sgd_step_`.
    """
    opt = torch.optim.SGD(client.parameters(), lr=LR)
    layers = linear_chain(client) if fused else []
    rates = plain_sgd_rates(opt, layers) if fused else None
    x, y = dm.client_tensors(cid)
    gen = torch_generator(seed=0, round_idx=round_idx, client_id=cid, purpose="batches")
    for idx in local_batches(num_samples=len(y), batch_size=BATCH, epochs=1, steps=None, generator=gen):
        if fused:
            fused_sgd_step_(layers, x[idx], y[idx], rates=rates)
            continue
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(client(x[idx]), y[idx]).backward()
        opt.step()
    return len(y)


def plain_round(model: torch.nn.Module, client: torch.nn.Module, dm: MNISTDataModule, round_idx: int) -> None:
    """One S2 round written directly in PyTorch: 100 clients, weighted mean, test pass."""
    w = flat_parameters(model)
    total = torch.zeros_like(w, dtype=torch.float64)
    n = 0
    for cid in cohort_of(round_idx):
        assign_flat_(client, w)
        size = local_epoch(client, dm, cid, round_idx)
        total.add_(flat_parameters(client) - w, alpha=size)
        n += size
    assign_flat_(model, w + (total / n).float())
    assert dm._test is not None
    x_test, y_test = dm._test  # the plain loop's test pass over the same tensors
    correct = 0
    with torch.no_grad():
        for start in range(0, len(y_test), 1024):
            correct += int((model(x_test[start : start + 1024]).argmax(1) == y_test[start : start + 1024]).sum())


def peer_round(
    model: torch.nn.Module, dm: MNISTDataModule, round_idx: int, buffers: list[torch.Tensor], fused: bool = False
) -> None:
    """One S2 round as the suite's plain peer does it (``benchmarks/perf/systems/plain_loop.py``):
    weights copied in tensor by tensor, trained weights summed in place into float32 buffers (no
    flat upload, no float64 sum), the test set in one forward pass; the plain arm's clients and batches."""
    params = list(model.parameters())
    global_w = [p.detach().clone() for p in params]
    for buf in buffers:
        buf.zero_()
    n = 0
    for cid in cohort_of(round_idx):
        with torch.no_grad():
            for p, g in zip(params, global_w, strict=True):
                p.copy_(g)
        size = local_epoch(model, dm, cid, round_idx, fused)
        with torch.no_grad():
            for buf, p in zip(buffers, params, strict=True):
                buf.add_(p, alpha=size)
        n += size
    with torch.no_grad():
        for p, buf in zip(params, buffers, strict=True):
            p.copy_(buf / n)
        assert dm._test is not None
        x_test, y_test = dm._test
        float((model(x_test).argmax(1) == y_test).float().mean())


def timed_rounds(rounds: int, one_round: Callable[[int], None]) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of ``one_round(r)`` for r = 0..rounds, the first round dropped."""
    times = []
    for r in range(rounds + 1):
        start, cpu = time.perf_counter(), time.process_time()
        one_round(r)
        times.append((time.perf_counter() - start, time.process_time() - cpu))
    return times[1:]


def mlp() -> torch.nn.Module:
    return build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)


def plain_times(dm: MNISTDataModule, rounds: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each round after the first."""
    model, client = mlp(), mlp()
    return timed_rounds(rounds, lambda r: plain_round(model, client, dm, r))


def peer_times(dm: MNISTDataModule, rounds: int, fused: bool = False) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each round after the first, the suite's plain peer's way."""
    model = mlp()
    buffers = [torch.zeros_like(p) for p in model.parameters()]
    return timed_rounds(rounds, lambda r: peer_round(model, dm, r, buffers, fused))


class _Timer(L.Callback):
    """Wall time from one round's start to the next round's start (so evaluation is included)."""

    latest: _Timer | None = None  # the one a composed config built (the ``cli`` arm)

    def __init__(self) -> None:
        self.starts: list[tuple[float, float]] = []
        _Timer.latest = self

    def on_train_batch_start(self, *args: object) -> None:
        self.starts.append((time.perf_counter(), time.process_time()))

    def on_train_end(self, *args: object) -> None:
        self.starts.append((time.perf_counter(), time.process_time()))

    def round_times(self) -> list[tuple[float, float]]:
        return [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(self.starts)]


def engine_times(
    dm: MNISTDataModule, rounds: int, profile: str | None = None, local_execution: str = "fused"
) -> list[tuple[float, float]]:
    module = FedAvg(
        model=mlp(),
        datamodule=dm,
        batch_size=BATCH,
        client_optimizer=functools.partial(torch.optim.SGD, lr=LR),
        local_execution=local_execution,
    )
    timer = _Timer()
    trainer = bare_trainer(callbacks=[UniformSampler(clients_per_round=COHORT), timer], rounds=rounds + 1, eval_every=1)
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(trainer.fit, module)
        profiler.dump_stats(profile)
    else:
        trainer.fit(module)
    return timer.round_times()[1:]


def cli_times(root: str, rounds: int, extra: list[str]) -> list[tuple[float, float]]:
    """Round times of S2 as the ``fedlightning`` command composes and runs it."""
    from hydra import compose, initialize_config_dir
    from perf.workloads import _mnist  # type: ignore[import-not-found]  # benchmarks/ is sys.path[0]

    from fedlightning.run import run

    overrides = [
        *_mnist(CLIENTS, 60, COHORT, BATCH),
        f"data.root={root}",
        f"rounds={rounds + 1}",
        "eval_every=1",
        "threads=1",
        "trainer.enable_progress_bar=false",
        f"+callbacks.timer._target_={__name__}._Timer",
        *extra,
    ]
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    with tempfile.TemporaryDirectory() as folder:
        run(cfg, folder)
    assert _Timer.latest is not None
    return _Timer.latest.round_times()[1:]


def medians(times: dict[str, list[tuple[float, float]]], base: str) -> Iterator[tuple[str, str, float, float]]:
    """(clock, arm, the arm's median round, ``base``'s median round) for wall and CPU seconds.

    CPU seconds are this process's: less sensitive to other load than wall time.
    """
    for k, what in ((0, "wall"), (1, "CPU")):
        b = statistics.median(t[k] for t in times[base])
        for arm in times:
            yield what, arm, statistics.median(t[k] for t in times[arm]), b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", default=None, help="write a cProfile of one engine run here and stop")
    parser.add_argument(
        "--arms",
        default="plain,engine",
        help=f"comma-separated: {NAMES}",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    dm = datamodule(args.data_root)
    if args.profile:
        profiled = engine_times(dm, args.rounds, args.profile)
        print(f"engine median round {statistics.median(t[0] for t in profiled):.4f} s; profile in {args.profile}")
        return
    chosen = args.arms.split(",")
    arms: dict[str, Callable[[], list[tuple[float, float]]]] = {
        "plain": functools.partial(plain_times, dm, args.rounds),
        "peer": functools.partial(peer_times, dm, args.rounds),
        "peer_fused": functools.partial(peer_times, dm, args.rounds, fused=True),
        "engine": functools.partial(engine_times, dm, args.rounds),
        "engine_autograd": functools.partial(engine_times, dm, args.rounds, local_execution="loop"),
        "engine_vectorised": functools.partial(engine_times, dm, args.rounds, local_execution="vectorised"),
    }
    for arm in chosen:
        if arm == "cli" or arm.startswith("cli:"):
            extra = [o for o in arm.removeprefix("cli").removeprefix(":").split(";") if o]
            arms[arm] = functools.partial(cli_times, args.data_root, args.rounds, extra)
    if unknown := set(chosen) - set(arms):
        parser.error(f"unknown arm(s) {sorted(unknown)}; choose from {NAMES}")
    times: dict[str, list[tuple[float, float]]] = {arm: [] for arm in chosen}
    for _ in range(args.repeats):  # interleaved, so machine load hits every arm alike
        for arm in chosen:
            times[arm] += arms[arm]()
    base = chosen[0]
    for what, arm, m, b in medians(times, base):
        print(
            f"{what}: {arm} round median {m:.4f} s over {len(times[arm])} rounds; ratio to {base} {m / b:.3f}, "
            f"per-client difference {(m - b) / COHORT * 1e3:+.3f} ms"
        )


if __name__ == "__main__":
    main()
