"""Exact communication accounting, per round × client × direction.

Bits are read off the encoded :class:`~fedlightning.federated.message.Message` that each
client receives and sends, never computed from a formula. Each process counts the messages of
the clients it holds; the counters are int64, summed across processes at the end of each
round, saved in checkpoints, and logged as float64 (a float32 log would round totals above
2**24). Only the first process writes ``comm_records.csv``.
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor
from typing_extensions import override

from fedlightning.federated.hooks import Direction, FederatedCallback
from fedlightning.federated.message import Message, SentShare
from fedlightning.federated.module import FederatedModule

UP, DOWN = 0, 1
# Round counters: uplink bits, downlink bits, uplink messages, downlink messages, the dense
# float32 bits the same messages would have cost, and the bits of control messages (already
# included in the uplink/downlink bits: e.g. the update norms of optimal client sampling).
_UP_BITS, _DOWN_BITS, _UP_MSGS, _DOWN_MSGS, _UP_DENSE, _DOWN_DENSE, _UP_CONTROL, _DOWN_CONTROL = range(8)
_COUNTERS = 8


def compression_factor(dense_bits: int, actual_bits: int) -> float:
    """Dense float32 bits ÷ actual bits (``inf`` when nothing was sent, ``nan`` for 0/0).

    >>> compression_factor(32 * 10, 9 * 10)
    3.5555555555555554
    """
    if actual_bits == 0:
        return float("nan") if dense_bits == 0 else float("inf")
    return dense_bits / actual_bits


class CommunicationAccountant(FederatedCallback):
    """Counts every bit that crosses the wire and logs the ``comm/*`` metrics.

    Args:
        records_path: if set, a CSV file receiving one row per message (round, client,
            direction, bits, codec, kind, probability), appended to each round; ``round`` counts
            from 1 (round k is the k-th round, as in ``metrics.csv`` and the checkpoint
            ``round-000k.ckpt`` that holds k rounds). On resume, ``fedlightning.run`` first
            cuts it back to the checkpoint's round. ``kind`` is
            ``payload`` or ``control`` (the messages of an uploader choice, such as update
            norms); ``probability`` is the probability that the message is sent at all (the
            client's inclusion probability, for an upload the probability of uploading).
    """

    def __init__(self, *, records_path: str | Path | None = None) -> None:
        self.records_path = Path(records_path) if records_path is not None else None
        self.totals = torch.zeros(_COUNTERS, dtype=torch.int64)
        self.per_client = torch.zeros((0, 2), dtype=torch.int64)
        # This round's counts, as Python ints (one message costs no tensor op); tensors at the round's end.
        self._round = [0] * _COUNTERS
        self._round_per_client: Counter[tuple[int, int]] = Counter()  # (client, UP | DOWN) -> bits
        self._rows: list[tuple[int, int, str, int, str, str, float]] = []

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        num_clients = cast(FederatedModule, pl_module).num_clients
        if self.per_client.shape[0] != num_clients:
            grown = torch.zeros((num_clients, 2), dtype=torch.int64)
            grown[: self.per_client.shape[0]] = self.per_client[:num_clients]
            self.per_client = grown

    @override
    def on_round_start(self, trainer: L.Trainer, module: FederatedModule, round_idx: int) -> None:
        self._round = [0] * _COUNTERS
        self._round_per_client = Counter()
        self._rows.clear()

    @override
    def on_client_downlink(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int, message: Message
    ) -> None:
        self._count(module, round_idx, [client_id], [message.num_bits], [message.codec.name], DOWN, "payload")

    @override
    def on_client_upload(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int, message: Message
    ) -> None:
        self._count(module, round_idx, [client_id], [message.num_bits], [message.codec.name], UP, "payload")

    @override
    def on_control_message(
        self,
        trainer: L.Trainer,
        module: FederatedModule,
        round_idx: int,
        client_id: int,
        direction: Direction,
        message: Message,
    ) -> None:
        side = UP if direction == "up" else DOWN
        self._count(module, round_idx, [client_id], [message.num_bits], [message.codec.name], side, "control")

    @override
    def on_share_downlink(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, sent: SentShare) -> None:
        self._count(module, round_idx, sent.client_ids, sent.num_bits, sent.codec_names, DOWN, "payload")

    @override
    def on_share_upload(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, sent: SentShare) -> None:
        self._count(module, round_idx, sent.client_ids, sent.num_bits, sent.codec_names, UP, "payload")

    @override
    def on_share_control(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, direction: Direction, sent: SentShare
    ) -> None:
        side = UP if direction == "up" else DOWN
        self._count(module, round_idx, sent.client_ids, sent.num_bits, sent.codec_names, side, "control")

    def _count(
        self,
        module: FederatedModule,
        round_idx: int,
        client_ids: list[int],
        num_bits: list[int],
        codecs: list[str],
        side: int,
        kind: str,
    ) -> None:
        """Count (and record) messages of ``side`` (UP or DOWN); ``kind`` is ``payload`` or ``control``.

        A control message's bits count in its direction's total and in the control total, not as a
        payload message.
        """
        bits = sum(num_bits)
        counts = self._round
        counts[_UP_BITS if side == UP else _DOWN_BITS] += bits
        if kind == "control":
            counts[_UP_CONTROL if side == UP else _DOWN_CONTROL] += bits
        else:
            counts[_UP_MSGS if side == UP else _DOWN_MSGS] += len(client_ids)
        per_client = self._round_per_client
        for client_id, n in zip(client_ids, num_bits, strict=True):
            per_client[client_id, side] += n
        if self.records_path is not None:
            direction = "up" if side == UP else "down"
            probability = module.inclusion_probability
            # The engine's round_idx counts from 0; every file counts rounds from 1.
            self._rows.extend(
                (round_idx + 1, client_id, direction, n, codec, kind, probability(client_id))
                for client_id, n, codec in zip(client_ids, num_bits, codecs, strict=True)
            )

    @override
    def on_round_end(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, metrics: dict[str, Any]
    ) -> None:
        # Each process counted the messages of its own clients: sum the counters, gather the rows.
        # Every payload message would have cost one dense float32 copy of the model.
        self._round[_UP_DENSE] = self._round[_UP_MSGS] * module.dense_message_bits
        self._round[_DOWN_DENSE] = self._round[_DOWN_MSGS] * module.dense_message_bits
        per_client = torch.zeros_like(self.per_client)
        if self._round_per_client:
            where = torch.tensor(list(self._round_per_client), dtype=torch.int64)
            per_client[where[:, 0], where[:, 1]] = torch.tensor(list(self._round_per_client.values()))
        counts = torch.cat([torch.tensor(self._round, dtype=torch.int64), per_client.reshape(-1)])
        counts = module.reduce_sum(counts).to(torch.int64).cpu()  # one collective for both
        round_counts = counts[: len(self._round)]
        self.totals += round_counts
        self.per_client += counts[len(self._round) :].reshape(self.per_client.shape)
        if self.records_path is not None and module.world_size > 1:
            parts: list[Any] = [None] * module.world_size
            dist.all_gather_object(parts, self._rows)
            self._rows = [row for part in parts for row in part]
        self._rows.sort()  # the same file whatever the process count or the order clients were sent in
        if trainer.is_global_zero:
            self._write_rows()
        self._rows.clear()
        exact = {
            "comm/uplink_bits": round_counts[_UP_BITS],
            "comm/downlink_bits": round_counts[_DOWN_BITS],
            **self._cumulative(),
        }
        if self.totals[_UP_CONTROL] or self.totals[_DOWN_CONTROL]:
            exact["comm/uplink_control_bits_total"] = self.totals[_UP_CONTROL]
            exact["comm/downlink_control_bits_total"] = self.totals[_DOWN_CONTROL]
        metrics.update({name: int(value) for name, value in exact.items()})
        uploads = int(round_counts[_UP_MSGS])
        if uploads:
            per_param = int(round_counts[_UP_BITS] - round_counts[_UP_CONTROL]) / (uploads * module.uplink_numel)
            metrics["comm/uplink_bits_per_param"] = per_param
        metrics["comm/uplink_compression"] = self.uplink_compression
        metrics["comm/downlink_compression"] = self.downlink_compression

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The evaluation row carries the x-axis values too, so loggers can plot accuracy
        # against cumulative bits (a W&B x-axis must be logged in the same row as the metric).
        if trainer.sanity_checking:
            return
        self._log_position(trainer, pl_module)

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_position(trainer, pl_module)

    def _log_position(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Every evaluation row says after how many rounds (from 1) and bits it was taken.
        pl_module.log("round", float(trainer.global_step), on_step=False, on_epoch=True)
        for name, value in self._cumulative().items():
            pl_module.log(name, _f64(value), on_step=False, on_epoch=True)

    def _cumulative(self) -> dict[str, Tensor]:
        up, down = self.totals[_UP_BITS], self.totals[_DOWN_BITS]
        return {"comm/uplink_bits_total": up, "comm/downlink_bits_total": down, "comm/bits_total": up + down}

    def _write_rows(self) -> None:
        if self.records_path is None or not self._rows:
            return
        new_file = not self.records_path.exists()
        self.records_path.parent.mkdir(parents=True, exist_ok=True)
        with self.records_path.open("a", newline="") as handle:
            writer = csv.writer(handle)
            if new_file:
                writer.writerow(["round", "client", "direction", "bits", "codec", "kind", "probability"])
            writer.writerows(self._rows)
        self._rows.clear()

    # ------------------------------------------------------------------ results
    @property
    def uplink_compression(self) -> float:
        """Dense float32 uplink bits ÷ actual uplink bits, over the whole run."""
        return compression_factor(int(self.totals[_UP_DENSE]), int(self.totals[_UP_BITS]))

    @property
    def downlink_compression(self) -> float:
        """Dense float32 downlink bits ÷ actual downlink bits, over the whole run."""
        return compression_factor(int(self.totals[_DOWN_DENSE]), int(self.totals[_DOWN_BITS]))

    def summary(self) -> dict[str, float | int]:
        """Totals and factors for ``summary.json`` (bit counts as exact Python ints)."""
        uploads = int(self.totals[_UP_MSGS])
        up = int(self.totals[_UP_BITS])
        return {
            "comm/uplink_bits_total": up,
            "comm/downlink_bits_total": int(self.totals[_DOWN_BITS]),
            "comm/bits_total": up + int(self.totals[_DOWN_BITS]),
            "comm/uplink_messages": uploads,
            "comm/downlink_messages": int(self.totals[_DOWN_MSGS]),
            "comm/uplink_bits_per_client_round": up / uploads if uploads else 0.0,
            "comm/uplink_control_bits_total": int(self.totals[_UP_CONTROL]),
            "comm/downlink_control_bits_total": int(self.totals[_DOWN_CONTROL]),
            "comm/uplink_compression": self.uplink_compression,
            "comm/downlink_compression": self.downlink_compression,
        }

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"totals": self.totals.clone(), "per_client": self.per_client.clone()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        totals = state_dict["totals"].to(torch.int64)
        self.totals = torch.zeros(_COUNTERS, dtype=torch.int64)
        self.totals[: totals.numel()] = totals  # checkpoints written before the control counters
        self.per_client = state_dict["per_client"].to(torch.int64)


def _f64(value: Tensor | int) -> Tensor:
    return torch.as_tensor(value, dtype=torch.float64)
