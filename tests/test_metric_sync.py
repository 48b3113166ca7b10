"""Evaluation metrics summed by all-reduce equal torchmetrics' own gather (2 gloo processes)."""

from __future__ import annotations

import os
import socket
from collections import Counter
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.regression import R2Score

from fedlightning.federated.metric_sync import sum_states_across_processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _counting(calls: Counter[str], name: str) -> Any:
    original = getattr(dist, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return original(*args, **kwargs)

    return counted


def _rank(rank: int, port: int, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        gen = torch.Generator().manual_seed(rank)
        n = 7 + 5 * rank  # unequal shards
        logits, target = torch.randn(n, 4, generator=gen), torch.randint(0, 4, (n,), generator=gen)
        values, weights = torch.randn(3 + rank, generator=gen), torch.rand(3 + rank, generator=gen)
        pred, truth = torch.randn(9, generator=gen), torch.randn(9, generator=gen)

        def metrics(**kwargs: Any) -> list[Any]:
            return [
                MulticlassAccuracy(num_classes=4, average="micro", **kwargs),
                MeanMetric(**kwargs),
                R2Score(**kwargs),
            ]

        def computed(ms: list[Any], *, sum_first: bool = False) -> list[float]:
            ms[0].update(logits, target)
            ms[1].update(values, weight=weights)
            ms[2].update(pred, truth)
            if sum_first:
                sum_states_across_processes(ms)
            return [float(m.compute()) for m in ms]

        gathered = computed(metrics())
        calls: Counter[str] = Counter()
        patched = {name: getattr(dist, name) for name in ("all_reduce", "all_gather", "barrier")}
        for name in patched:
            setattr(dist, name, _counting(calls, name))
        try:
            together = computed(metrics(sync_on_compute=False), sum_first=True)
        finally:
            for name, fn in patched.items():
                setattr(dist, name, fn)
        results[rank] = (gathered, together, dict(calls))
    finally:
        dist.destroy_process_group()


def test_metrics_summed_in_one_all_reduce_equal_gathered_ones() -> None:
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(_free_port(), results), nprocs=2)
    for rank in (0, 1):
        gathered, together, calls = results[rank]
        assert together == gathered  # two addends: the same sum in either order, bit for bit
        assert calls == {"all_reduce": 1}  # every state of all three metrics at once; no barrier, no gather
    assert results[0][1] == results[1][1]  # every process holds the same score


def test_summing_states_refuses_a_metric_that_syncs_itself_and_is_a_no_op_in_one_process() -> None:
    with pytest.raises(ValueError, match="MeanMetric syncs itself on compute; build it with sync_on_compute=False"):
        sum_states_across_processes([MeanMetric()])
    mean = MeanMetric(sync_on_compute=False)
    mean.update(torch.tensor([1.0, 3.0]))
    sum_states_across_processes([mean])
    assert float(mean.compute()) == 2.0
