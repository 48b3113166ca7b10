"""What a run prints: one round-level progress bar and each log line once.

* :class:`RoundProgressBar` shows ``round k/R · val acc 0.9167 · uplink 4,617,600 bits``: rounds
  and bits as integers, the validation score of the latest evaluation, and no validation,
  test or sanity-check bars (a round's evaluation is part of the round).
* :func:`quiet_lightning` makes Lightning's log lines appear once (under Hydra, the root
  logger already prints them, and Lightning's own handler would print each again) and drops
  the notices that say nothing about the run, matched by their message only.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

import lightning as L
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm, TQDMProgressBar
from typing_extensions import override

#: Lightning log messages that say nothing about the run (matched by their beginning).
SILENCED_MESSAGES = (
    "💡 Tip: For seamless cloud logging",  # an advertisement for another logger
    "`Trainer(val_check_interval=",  # says "every batch"; a run's batch is one round
)
#: Warnings from library internals that the user cannot act on (regular expressions).
SILENCED_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning's pytree helper on torch >= 2.9
)


class _DropMessages(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(prefix) for prefix in SILENCED_MESSAGES)


_FILTER = _DropMessages()


def quiet_lightning() -> None:
    """Print each Lightning log line once and silence :data:`SILENCED_MESSAGES`/:data:`SILENCED_WARNINGS`.

    Idempotent. When the root logger has handlers (Hydra's job logging, which also writes the
    job's log file), Lightning's own console handler on the ``lightning`` logger is removed,
    so each record is printed once, by the root logger; without root handlers Lightning keeps
    printing its lines itself.
    """
    lightning_logger = logging.getLogger("lightning")
    if logging.getLogger().handlers:
        for handler in list(lightning_logger.handlers):
            if type(handler) is logging.StreamHandler:
                lightning_logger.removeHandler(handler)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    for message in SILENCED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def progress_text(*, score_name: str, score: float | None, uplink_bits: int | None) -> str:
    """The bar's postfix: the latest validation score and the cumulative uplink bits.

    >>> progress_text(score_name="acc", score=0.91666, uplink_bits=4617600)
    'val acc 0.9167 · uplink 4,617,600 bits'
    >>> progress_text(score_name="acc", score=None, uplink_bits=None)
    ''
    """
    parts = []
    if score is not None:
        parts.append(f"val {score_name} {score:.4f}")
    if uplink_bits is not None:
        parts.append(f"uplink {uplink_bits:,} bits")
    return " · ".join(parts)


def ratio_text(ratio: float) -> str:
    """A compression ratio as a reader says it: ``1,020×``, ``32×``, ``1.5×``.

    >>> ratio_text(1020.4), ratio_text(31.99), ratio_text(1.5), ratio_text(1.0)
    ('1,020×', '32×', '1.5×', '1×')
    """
    if ratio >= 100:
        return f"{ratio:,.0f}×"
    return f"{ratio:.3g}×"


def result_text(summary: dict[str, Any], *, score_name: str) -> str:
    """The run's closing line: the test score (``nan`` only when the run has none), the exact
    bit totals (with thousands separators, as the bar prints them) and the uplink compression
    against dense float32, and the wall time.

    >>> result_text({"test/acc": 0.0, "comm/uplink_bits_total": 76960000, "comm/uplink_compression": 1020.4,
    ...              "comm/downlink_bits_total": 640, "time/wall_s": 2.04}, score_name="acc")
    'test/acc 0.0000 | uplink 76,960,000 bits (1,020× vs float32) | downlink 640 bits | 2.0 s'
    """
    score = summary.get(f"test/{score_name}")
    uplink, downlink = int(summary["comm/uplink_bits_total"]), int(summary["comm/downlink_bits_total"])
    return (
        f"test/{score_name} {float('nan') if score is None else score:.4f}"
        f" | uplink {uplink:,} bits ({ratio_text(float(summary['comm/uplink_compression']))} vs float32)"
        f" | downlink {downlink:,} bits | {summary['time/wall_s']:.1f} s"
    )


class RoundProgressBar(TQDMProgressBar):
    """One bar over the run's rounds; no validation, test or sanity-check bars.

    Args:
        score_name: the validation score shown (``acc``; ``r2`` for regression).
        refresh_rate: redraw every k rounds.
    """

    BAR_FORMAT = "round {n_fmt}/{total_fmt}{desc} |{bar:20}| {elapsed}<{remaining}"

    def __init__(self, *, score_name: str = "acc", refresh_rate: int = 1) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=True)
        self.score_name = score_name
        self._score: float | None = None

    def _silent(self) -> Tqdm:
        return Tqdm(disable=True)

    @override
    def init_sanity_tqdm(self) -> Tqdm:
        return self._silent()

    @override
    def init_validation_tqdm(self) -> Tqdm:
        return self._silent()

    @override
    def init_test_tqdm(self) -> Tqdm:
        return self._silent()

    @override
    def init_predict_tqdm(self) -> Tqdm:
        return self._silent()

    @override
    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(
            total=self.trainer.max_steps,
            initial=self.trainer.global_step,  # a resumed run starts at its checkpoint's round
            position=2 * self.process_position,
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=self.BAR_FORMAT,
        )

    @override
    def on_train_start(self, *_: Any) -> None:
        pass  # the bar is made when the round loader's (only) epoch starts

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        # One epoch of the round loader is the whole run: the bar counts rounds.
        self.train_progress_bar = self.init_train_tqdm()

    def _round_bar(self) -> Tqdm:
        """The round bar, made on first use: a run resumed mid-epoch gets no ``on_train_epoch_start``."""
        if self._train_progress_bar is None:
            self.train_progress_bar = self.init_train_tqdm()
        return self.train_progress_bar

    @override
    def on_train_batch_start(self, trainer: L.Trainer, *_: Any) -> None:
        self._round_bar()  # before the round's step, so the bar starts at the checkpoint's round

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self._round_bar()
        if bar.disable:
            return
        if self._should_update(trainer.global_step, trainer.max_steps):
            bar.n = trainer.global_step
            bar.set_description_str(self._text(trainer), refresh=True)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        bar = self._round_bar()
        if not bar.disable:
            bar.n = trainer.global_step
            bar.set_description_str(self._text(trainer), refresh=True)
        bar.close()

    @override
    def on_train_end(self, *_: Any) -> None:
        if self._train_progress_bar is not None:
            self._train_progress_bar.close()

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.val_progress_bar.close()
        self.reset_dataloader_idx_tracker()
        value = trainer.callback_metrics.get(f"val/{self.score_name}")
        if value is not None and not trainer.sanity_checking:
            self._score = float(value)
        if self._train_progress_bar is not None and trainer.state.fn == "fit" and not self.train_progress_bar.disable:
            self.train_progress_bar.set_description_str(self._text(trainer), refresh=True)

    def _text(self, trainer: L.Trainer) -> str:
        bits = trainer.callback_metrics.get("comm/uplink_bits_total")
        text = progress_text(
            score_name=self.score_name, score=self._score, uplink_bits=None if bits is None else int(bits)
        )
        return f" · {text}" if text else ""
