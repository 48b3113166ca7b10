"""Workloads S0..S7 of the suite: what each system runs, and the FLOPs of one round.

S1: MNIST IID, 10 clients x 6,000, all train every round, MLP 784-300-100-10, 1 local epoch,
batch 32, SGD lr 0.05 without momentum, FedAvg weighted by examples, test-set evaluation
after every round. S2: 1,000 clients x 60, 100 per round, batch 10. S3: S1 with top-1 % +
error feedback + 8-bit values. S5: S1 with Federated Zampling (m/n = 32, d = 10) at batch 32.
S0: Golub, logistic regression, 6 clients, full batch (pure per-round overhead). S7: 1k / 10k /
100k registered clients (synthetic logistic data, 5 samples per client, 10 per round): start-up
and peak memory. ``--quick`` keeps every shape but shortens runs (S0 50 rounds, S5 2, S7 only 1k
and 100k clients); S1, S3 and S5 then train on a labelled subset (10 clients x 1,200 samples).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Multiply-accumulates of one forward pass of the 784-300-100-10 MLP, per sample.
MLP_MACS = 784 * 300 + 300 * 100 + 100 * 10
MNIST_TEST = 10_000


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One workload: its shape, the peers that can run it, the fedlightning overrides."""

    id: str
    title: str
    rounds: int
    clients: int = 10
    per_client: int = 6000
    per_round: int = 10
    batch: int = 32
    peers: bool = False  # the MNIST FedAvg shape every peer implements
    overrides: tuple[str, ...] = ()
    subset: str = ""  # a label when the data is a subset
    flops_per_round: float | None = None
    notes: str = ""
    extra: dict[str, object] = field(default_factory=dict)


def mnist_fedavg_flops(samples_per_round: int) -> float:
    """FLOPs of one FedAvg round of the MLP: training (forward + backward, 3 x 2 MACs per sample)
    on ``samples_per_round`` samples and one forward over the 10k test set."""
    return 6.0 * MLP_MACS * samples_per_round + 2.0 * MLP_MACS * MNIST_TEST


def _mnist(clients: int, per_client: int, per_round: int, batch: int) -> list[str]:
    sampler = ["sampler=full"] if per_round >= clients else ["sampler=uniform", f"clients_per_round={per_round}"]
    subset = [] if clients * per_client >= 60_000 else [f"data.max_train_samples={clients * per_client}"]
    return [
        "data=mnist",
        f"data.num_clients={clients}",
        "data.val_fraction=0",
        *subset,
        "partition=iid",
        "model=mnistfc",
        "method=fedavg",
        f"method.batch_size={batch}",
        "method.client_optimizer.lr=0.05",
        "method.client_optimizer.momentum=0",
        "method.client_optimizer.nesterov=false",
        *sampler,
    ]


def workloads(quick: bool) -> list[Workload]:
    """The suite's workloads (``quick``: shorter runs, S1/S3/S5 on a subset)."""
    s1_per_client = 1200 if quick else 6000
    s1_subset = "subset: 10 clients x 1,200 of MNIST's 60,000 training samples" if quick else ""
    r1 = 3 if quick else 5
    r5 = 2 if quick else 5  # S5 (11 s a round on one core): round 2 is the one timed in --quick
    s1 = _mnist(10, s1_per_client, 10, 32)
    out = [
        Workload(
            id="S1",
            title="MNIST mnistfc, 10 IID clients, batch 32",
            rounds=r1,
            per_client=s1_per_client,
            peers=True,
            overrides=tuple(s1),
            subset=s1_subset,
            flops_per_round=mnist_fedavg_flops(10 * s1_per_client),
        ),
        Workload(
            id="S2",
            title="MNIST mnistfc, 1,000 clients x 60, 100 per round, batch 10",
            rounds=4 if quick else 5,
            clients=1000,
            per_client=60,
            per_round=100,
            batch=10,
            peers=True,
            overrides=tuple(_mnist(1000, 60, 100, 10)),
            flops_per_round=mnist_fedavg_flops(100 * 60),
        ),
        Workload(
            id="S0",
            title="Golub, logistic regression, 6 clients, full batch",
            rounds=50 if quick else 500,
            overrides=(
                "data=golub",
                "data.num_clients=6",
                "model=logreg",
                "partition=iid",
                "method=fedavg",
                "method.batch_size=100000",
                "sampler=full",
            ),
            notes="pure per-round overhead; fedlightning only",
        ),
        Workload(
            id="S3",
            title="S1 with top-1% + error feedback + 8-bit values",
            rounds=r1,
            per_client=s1_per_client,
            overrides=(*s1, "compressor=top_k_ef"),
            subset=s1_subset,
            flops_per_round=mnist_fedavg_flops(10 * s1_per_client),
            notes="fedlightning only (the peers have no such compressor)",
        ),
        Workload(
            id="S5",
            title="S1 with Federated Zampling m/n = 32, d = 10, batch 32",
            rounds=r5,
            per_client=s1_per_client,
            overrides=(
                *[o for o in s1 if not o.startswith(("method", "model"))],
                "model=mnistfc",
                "method=zampling",
                "method.compression=32",
                "method.d=10",
                "method.batch_size=32",
                *(["reports.zampling_evaluation.test_samples=10"] if quick else []),
            ),
            subset=s1_subset,
            notes="fedlightning only; compared with S1 (target: at most 2x S1 per round)",
        ),
    ]
    for clients in (1_000, 100_000) if quick else (1_000, 10_000, 100_000):  # --quick: the two ends
        out.append(
            Workload(
                id=f"S7-{clients // 1000}k",
                title=f"{clients:,} registered clients (synthetic logistic, 5 samples each), 10 per round",
                rounds=1,
                clients=clients,
                per_client=5,
                overrides=(
                    "data=synthetic_logistic",
                    f"data.num_clients={clients}",
                    f"data.num_samples={5 * clients}",
                    "model=logreg",
                    "partition=iid",
                    "method=fedavg",
                    "sampler=uniform",
                    "clients_per_round=10",
                ),
                notes="start-up and peak memory; fedlightning only",
            )
        )
    return out
