"""The round's messages: the downlinks each client receives, the uploader choice, the uplinks and their accumulation.

A mixin of :class:`~fedlightning.federated.module.FederatedModule` holding phases 2 and 4 to 6
of its round (see that module): per client (:meth:`WirePhases._upload`) or, for a share
trained at once (:class:`~fedlightning.federated.local.ResultRows`), in bulk
(:meth:`WirePhases._take_rows`): one host read of the losses and upload sums, one channel call
(:meth:`~fedlightning.federated.channel.Channel.send_share`), one accounting call per direction
(:meth:`~fedlightning.federated.hooks.FederatedCallback.on_share_upload`) and one fold
(:meth:`~fedlightning.federated.aggregators.Aggregator.accumulate_rows`), with the per-client
path's bits, records and float64 sums.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from fedlightning.federated.aggregators import WeightedMean, accumulate_upload, upload_coefficient
from fedlightning.federated.client import ClientWork
from fedlightning.federated.codecs import Float32Codec
from fedlightning.federated.hooks import Direction, UploadChoice
from fedlightning.federated.local import ClientResult, ResultRows, overrides
from fedlightning.federated.message import Message, SentShare
from fedlightning.federated.rounds import LOSS, METRICS, TRAINED, RoundState

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule

__all__ = ["WirePhases"]


class WirePhases(ClientWork):
    """Phases *downlink* (per client), *choose*, *uplink* and *accumulate* of the engine's round."""

    def on_upload_decoded(self, *, client_id: int, round_idx: int, decoded: Tensor) -> None:
        """Server-side bookkeeping of one decoded upload, on the process that holds the client (a method hook)."""

    def _client_downlink(self, rnd: RoundState, client_id: int, state: Tensor, broadcast: Message) -> Tensor:
        """Phase *downlink*, per client: the message this client receives, observed and decoded."""
        module = cast("FederatedModule", self)
        message = broadcast
        if module.per_client_downlink:
            own = module.client_downlink(client_id=client_id, round_idx=rnd.round_idx, broadcast=state)
            message = module.downlink_channel.codec.encode(own)
        for cb in rnd.callbacks:
            cb.on_client_downlink(module.trainer, module, rnd.round_idx, client_id, message)
        return rnd.received_broadcast if message is broadcast else message.decode().to(module.device)

    def _share_downlink(self, rnd: RoundState, share: list[int], state: Tensor, broadcast: Message) -> list[Tensor]:
        """Phase *downlink* for a share trained at once: each client's decoded message, observed in one call."""
        module = cast("FederatedModule", self)
        if module.per_client_downlink:
            return [module._client_downlink(rnd, client_id, state, broadcast) for client_id in share]
        k = len(share)
        sent = SentShare(
            client_ids=share,
            num_bits=[broadcast.num_bits] * k,
            codec_names=[broadcast.codec.name] * k,
            message=lambda _: broadcast,
        )
        for cb in rnd.callbacks:
            cb.on_share_downlink(module.trainer, module, rnd.round_idx, sent)
        return [rnd.received_broadcast] * k

    def _take_rows(self, rnd: RoundState, share: ResultRows) -> None:
        """The per-client steps of the engine's attempt for a share trained at once, in bulk.

        One host read gives every client's loss and upload sum (the quarantine test of
        :func:`upload_check`); the finite uploads are then chosen, sent and folded in as one share.
        """
        module = cast("FederatedModule", self)
        checks = torch.stack([share.losses.detach().float(), share.uploads.detach().sum(dim=1).float()]).tolist()
        finite = []
        loss_sum = float(rnd.stats[LOSS])  # summed in float64 in client order, as the tensor would
        for k, (client_id, loss, total) in enumerate(zip(share.client_ids, *checks, strict=True)):
            if not (math.isfinite(loss) and math.isfinite(total)):
                module._divergence_watch.quarantine(rnd, client_id, loss)  # never reaches the aggregator
                continue
            loss_sum += loss
            finite.append(k)
        rnd.stats[LOSS] = loss_sum
        rnd.stats[TRAINED] += len(finite)
        if not rnd.choose_later:
            module._upload_rows(rnd, share, finite, choice=None)
            return
        pairs = list(share)
        choice = module._choose(rnd, [pairs[k] for k in finite])
        chosen = [k for k in finite if share.client_ids[k] in choice]
        module._upload_rows(rnd, share, chosen, choice=choice)

    def _choose_and_upload(self, rnd: RoundState, buffered: list[tuple[int, ClientResult]]) -> None:
        """Phase *choose*: the sampler sees every cohort member's ‖update‖₂, then the chosen upload.

        The choice protocol's control messages are observed per client. With the normalised
        estimator every member that computed counts in the total weight, whether it was chosen,
        and whether its upload then arrived or was lost.
        """
        module = cast("FederatedModule", self)
        chosen = module._choose(rnd, buffered)
        for client_id, result in buffered:
            if client_id in chosen:
                module._upload(rnd, client_id, result, rnd.probability[client_id], choice_probability=chosen[client_id])

    def _choose(self, rnd: RoundState, buffered: list[tuple[int, ClientResult]]) -> dict[int, float]:
        """The uploaders the sampler chooses from the members' norms (read in one transfer), and their q_i.

        The choice's control messages are sent as one share per direction; with the normalised
        estimator every member that computed is counted in the total weight here.
        """
        module = cast("FederatedModule", self)
        assert rnd.sampler is not None
        norms = torch.zeros(len(rnd.cohort), dtype=torch.float64)
        if buffered:
            where = {cid: k for k, cid in enumerate(rnd.cohort.client_ids)}
            position = torch.tensor([where[cid] for cid, _ in buffered])
            norms[position] = torch.stack([result.upload.detach().double().norm() for _, result in buffered]).cpu()
        choice: UploadChoice = rnd.sampler.choose_uploaders(
            module.trainer, module, rnd.cohort, module.reduce_sum(norms)
        )
        members = [cid for cid, _ in buffered]
        directions: tuple[tuple[Direction, dict[int, Tensor]], ...] = (
            ("up", choice.uplink_control),
            ("down", choice.downlink_control),
        )
        for direction, control in directions:
            ids = [cid for cid in members if cid in control]
            if ids:
                values = [control[cid] for cid in ids]
                if all(v.shape == values[0].shape for v in values):  # the share's messages in bulk
                    sent, _ = Float32Codec().encode_rows(torch.stack(values), client_ids=ids)
                else:
                    sent = SentShare.of(ids, [Float32Codec().encode(v) for v in values])
                for cb in rnd.callbacks:
                    cb.on_share_control(module.trainer, module, rnd.round_idx, direction, sent)
        if module.aggregation == "normalised":  # every member that computed, chosen, lost or not
            assert isinstance(rnd.aggregator, WeightedMean)
            for client_id, result in buffered:
                rnd.aggregator.add_mass(module.client_share(client_id=client_id, num_samples=result.num_samples))
        return dict(zip(choice.uploaders.client_ids, choice.uploaders.inclusion_probabilities.tolist(), strict=True))

    def _upload(
        self,
        rnd: RoundState,
        client_id: int,
        result: ClientResult,
        inclusion_probability: float,
        *,
        choice_probability: float | None = None,
    ) -> None:
        """Phases *uplink* and *accumulate* for one client: drop, or encode, decode and fold in.

        ``choice_probability`` is q_i of a client chosen after local work (see
        :meth:`_choose_and_upload`); the upload's coefficient is then divided by it.
        """
        module = cast("FederatedModule", self)
        trainer = module.trainer
        if any(cb.drops_upload(trainer, module, rnd.round_idx, client_id) for cb in rnd.hooked("drops_upload")):
            for cb in rnd.callbacks:
                cb.on_upload_dropped(trainer, module, rnd.round_idx, client_id)
            return
        channel = module.uplink_channel
        message, decoded = channel.send(
            result.upload,
            client_id=client_id,
            # (the plain codec draws nothing: no stream to derive)
            generator=None if channel.compressor is None else module.generator(rnd.round_idx, client_id, "compress"),
            state=module.client_state,
        )
        q = 1.0 if choice_probability is None else choice_probability
        for cb in rnd.hooked("arrival_probability"):  # e.g. drop-outs at a known rate, corrected for
            q *= cb.arrival_probability(trainer, module, rnd.round_idx, client_id)
        module._phase_probability[client_id] = inclusion_probability * q
        for cb in rnd.hooked("on_client_upload"):
            cb.on_client_upload(trainer, module, rnd.round_idx, client_id, message)
        decoded = decoded.to(module.device)
        module.on_upload_decoded(client_id=client_id, round_idx=rnd.round_idx, decoded=decoded)
        weight = module.upload_weight(
            client_id=client_id, num_samples=result.num_samples, inclusion_probability=inclusion_probability * q
        )
        chosen = choice_probability is not None
        accumulate_upload(rnd.aggregator, decoded, weight=weight, q=q, chosen=chosen, estimator=module.aggregation)
        for k, name in enumerate(module.client_metric_names):
            rnd.stats[METRICS + k] += float(result.metrics[name])

    def _upload_rows(
        self, rnd: RoundState, share: ResultRows, rows: list[int], *, choice: dict[int, float] | None
    ) -> None:
        """Phases *uplink* and *accumulate* for rows ``rows`` of a share trained at once, as one share.

        The same drops, messages, probabilities and sums as :meth:`_upload` of each row in turn;
        ``choice`` holds the choice probabilities q_i of clients chosen after local work.
        """
        module = cast("FederatedModule", self)
        trainer, round_idx = module.trainer, rnd.round_idx
        arrived = []
        for k in rows:
            client_id = share.client_ids[k]
            if any(cb.drops_upload(trainer, module, round_idx, client_id) for cb in rnd.hooked("drops_upload")):
                for cb in rnd.callbacks:
                    cb.on_upload_dropped(trainer, module, round_idx, client_id)
                continue
            arrived.append(k)
        if not arrived:
            return
        ids = [share.client_ids[k] for k in arrived]
        uploads = share.uploads
        if len(arrived) < len(share.client_ids):
            uploads = uploads.index_select(0, torch.tensor(arrived, device=uploads.device))
        channel = module.uplink_channel
        sent, decoded = channel.send_share(
            uploads,
            client_ids=ids,
            generator=lambda client_id: module.generator(round_idx, client_id, "compress"),
            state=module.client_state,
        )
        weights: list[float] = []
        masses: list[float | None] = []
        for k, client_id in zip(arrived, ids, strict=True):
            q = 1.0 if choice is None else choice[client_id]
            for cb in rnd.hooked("arrival_probability"):  # e.g. drop-outs at a known rate, corrected for
                q *= cb.arrival_probability(trainer, module, round_idx, client_id)
            inclusion = rnd.probability[client_id] * q
            module._phase_probability[client_id] = inclusion
            weight = module.upload_weight(
                client_id=client_id, num_samples=share.num_samples[k], inclusion_probability=inclusion
            )
            coefficient, mass = upload_coefficient(
                weight=weight, q=q, chosen=choice is not None, estimator=module.aggregation
            )
            weights.append(coefficient)
            masses.append(mass)
        for cb in rnd.callbacks:
            cb.on_share_upload(trainer, module, round_idx, sent)
        rows_decoded: Tensor | list[Tensor] = decoded
        if module.device.type != "cpu":  # one transfer for the share's decoded rows
            rows_decoded = (torch.stack(decoded) if isinstance(decoded, list) else decoded).to(module.device)
        if not overrides(type(self), WirePhases, "on_upload_decoded"):
            rnd.aggregator.accumulate_rows(rows_decoded, weights=weights, masses=masses)
            return
        for k, client_id in enumerate(ids):  # the method's hook sees each upload before it is folded in
            module.on_upload_decoded(client_id=client_id, round_idx=round_idx, decoded=rows_decoded[k])
            rnd.aggregator.accumulate_rows(
                rows_decoded[k : k + 1], weights=weights[k : k + 1], masses=masses[k : k + 1]
            )
