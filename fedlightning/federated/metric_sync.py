"""Evaluation metrics summed across processes by one all-reduce.

By default torchmetrics syncs each state of a metric with a barrier and one or two all-gathers
(the shapes, then the values) and then reduces the gathered copies. Where every state of a
metric reduces by sum (accuracy's counts, a mean's sum and weight, R²'s sums), a sum gives the
same values: :func:`sum_states_across_processes` sums every state of several metrics, built
with ``sync_on_compute=False``, in a single all-reduce.

>>> from torchmetrics import MaxMetric
>>> sum_states_across_processes([MaxMetric(sync_on_compute=False)])
Traceback (most recent call last):
...
ValueError: MaxMetric has states that do not add up across processes (max_value); keep torchmetrics' gather.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_sum

__all__ = ["sum_states_across_processes"]


def sum_states_across_processes(metrics: Sequence[Metric]) -> None:
    """Replace every state of ``metrics`` by its sum over the processes, in one all-reduce.

    For metrics built with ``sync_on_compute=False``, whose ``compute`` then reads the summed
    states; a metric syncing itself on compute would add the other processes' share twice, and
    is refused, as is one with a state that does not add up. The states travel as float64, which
    holds integer counts below 2**53 and float32 values exactly. A no-op in a single process.
    """
    for metric in metrics:
        # (``_reductions`` is where ``Metric.add_state`` records each state's dist_reduce_fx)
        other = [name for name, fx in metric._reductions.items() if fx is not dim_zero_sum]
        if other:
            raise ValueError(
                f"{type(metric).__name__} has states that do not add up across processes ({', '.join(other)}); "
                "keep torchmetrics' gather."
            )
        if metric.sync_on_compute:
            raise ValueError(f"{type(metric).__name__} syncs itself on compute; build it with sync_on_compute=False.")
    states = [(metric, name, getattr(metric, name)) for metric in metrics for name in metric._reductions]
    if not states or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    flat = torch.cat([value.detach().reshape(-1).to(torch.float64) for _, _, value in states])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for metric, name, value in states:
        setattr(metric, name, flat[offset : offset + value.numel()].reshape(value.shape).to(value.dtype))
        offset += value.numel()
