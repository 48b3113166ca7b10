"""Command-line arguments of every system script (one FedAvg-on-MNIST workload)."""

from __future__ import annotations

import argparse


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True, help="folder holding MNIST/raw")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--clients", type=int, required=True, help="registered clients")
    p.add_argument("--per-client", type=int, required=True, help="samples per client")
    p.add_argument("--per-round", type=int, required=True, help="clients sampled per round")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def cohort(round_idx: int, clients: int, per_round: int, seed: int) -> list[int]:
    """The seeded cohort of a round (every client when ``per_round == clients``)."""
    import torch

    if per_round >= clients:
        return list(range(clients))
    g = torch.Generator().manual_seed(seed * 7919 + round_idx)
    return sorted(torch.randperm(clients, generator=g)[:per_round].tolist())
