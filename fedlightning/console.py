"""What a run prints: one round-level progress bar and each log line once.

* :class:`RoundProgressBar` shows ``round k/R · val acc 0.9167 · uplink 4,617,600 bits``: rounds
  and bits as integers, the validation score of the latest evaluation, and no validation,
  test or sanity-check bars (a round's evaluation is part of the round).
* :func:`quiet_lightning` makes Lightning's log lines appear once, through the root logger
  (under Hydra: the console and the job's ``cli.log``), drops the notices that say nothing
  about the run, and keeps the device and stopping notices out of the console (``cli.log``
  still has them); all matched by their message only.
* :func:`compressor_text` says which compressor a run uses, by its config choice, with ω and δ.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any, Protocol

import lightning as L
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm, TQDMProgressBar
from typing_extensions import override


class ChannelBounds(Protocol):
    """What :func:`compressor_text` reads of a channel (a ``fedlightning.federated.channel.ChannelMetadata``)."""

    @property
    def name(self) -> str: ...
    @property
    def unbiased(self) -> bool: ...
    @property
    def omega(self) -> float | None: ...
    @property
    def delta(self) -> float: ...
    @property
    def error_feedback(self) -> bool: ...
    @property
    def dim(self) -> int: ...


#: Lightning log messages that say nothing about the run (matched by their beginning).
SILENCED_MESSAGES = (
    "💡 Tip: For seamless cloud logging",  # an advertisement for another logger
    "`Trainer(val_check_interval=",  # says "every batch"; a run's batch is one round
)
#: Lightning notices kept out of the console (matched by their beginning): the run's ``cli.log`` keeps them.
CONSOLE_SILENCED_MESSAGES = (
    "GPU available: ",  # the devices: the run uses the configured accelerator or stops saying why
    "TPU available: ",
    "LOCAL_RANK: ",  # the visible CUDA devices
    "`Trainer.fit` stopped: `max_steps=",  # the configured number of rounds ran (the bar says so)
)
#: Lightning's loggers; each prints through its own handler when imported before logging is set up.
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
#: Warnings from library internals that the user cannot act on (regular expressions).
SILENCED_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning's pytree helper on torch >= 2.9
    # What is logged at an evaluation is already the same on every process: its results, summed
    # over the processes (fedlightning/federated/evaluation.py), the round, and the bit totals the
    # accountant sums across processes every round (fedlightning/callbacks/accounting.py);
    # sync_dist would only average equal numbers.
    r"It is recommended to use `self\.log\('(?:val/|test/|comm/|round')",
)


class _DropMessages(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(prefix) for prefix in SILENCED_MESSAGES)


class _KeepOffConsole(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("lightning"):
            return True
        message = record.getMessage()
        return not any(message.startswith(prefix) for prefix in CONSOLE_SILENCED_MESSAGES)


_FILTER = _DropMessages()
_CONSOLE_FILTER = _KeepOffConsole()


def quiet_lightning() -> None:
    """Print each Lightning log line once and silence :data:`SILENCED_MESSAGES`/:data:`SILENCED_WARNINGS`.

    Idempotent. When the root logger has handlers (Hydra's job logging: the console and the
    job's ``cli.log``), Lightning's own console handlers (``lightning``, ``lightning.pytorch``
    and ``lightning.fabric``, the latter two not propagating) are removed and its records
    propagate to the root logger, which prints each once and writes it to the log file; the
    console handler then leaves out :data:`CONSOLE_SILENCED_MESSAGES`. Without root handlers
    Lightning keeps printing its lines itself, less those notices.
    """
    stream = logging.StreamHandler  # exactly: a FileHandler (a subclass) is not a console
    root = logging.getLogger()
    if root.handlers:
        for name in LIGHTNING_LOGGERS:
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if type(handler) is stream:
                    logger.removeHandler(handler)
            logger.propagate = True
        consoles = [handler for handler in root.handlers if type(handler) is stream]
    else:
        consoles = [h for name in LIGHTNING_LOGGERS for h in logging.getLogger(name).handlers if type(h) is stream]
    for handler in consoles:
        if _CONSOLE_FILTER not in handler.filters:
            handler.addFilter(_CONSOLE_FILTER)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    for message in SILENCED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def number_text(value: float) -> str:
    """ω or δ as a reader says it: four significant digits, thousands separated, no exponent.

    >>> number_text(106.67690764980105), number_text(4.0), number_text(266610.0), number_text(0.0123456)
    ('106.7', '4', '266,610', '0.01235')
    """
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def compressor_text(*, group: str, choice: str, metadata: ChannelBounds) -> str:
    """The line naming a run's compressor of ``group`` (``compressor`` or ``downlink``) by its config choice.

    ω is the variance bound of an unbiased operator and δ its contraction (thesis arXiv
    2207.00392, §1.6), both for the ``metadata.dim``-vector the channel compresses.

    >>> from fedlightning.federated.channel import ChannelMetadata
    >>> meta = ChannelMetadata(name="top_k(0.01)/layerwise", unbiased=False, omega=None,
    ...                        delta=106.67690764980105, error_feedback=True, dim=4810)
    >>> compressor_text(group="compressor", choice="top_k_ef", metadata=meta)
    'Uplink compressor: compressor=top_k_ef (top_k(0.01) per layer, 4,810 entries, error feedback; biased, δ = 106.7)'
    >>> meta = ChannelMetadata(name="qsgd(p=2,s=16)", unbiased=True, omega=4.0, delta=5.0, error_feedback=False, dim=7)
    >>> compressor_text(group="downlink", choice="qsgd", metadata=meta)
    'Downlink compressor: downlink=qsgd (qsgd(p=2,s=16), 7 entries; unbiased, ω = 4, δ = 5)'
    """
    direction = "Uplink" if group == "compressor" else "Downlink"
    name = metadata.name
    if name.endswith("/layerwise"):
        name = name.removesuffix("/layerwise") + " per layer"
    memory = ", error feedback" if metadata.error_feedback else ""
    if metadata.unbiased and metadata.omega is not None:
        bounds = f"unbiased, ω = {number_text(metadata.omega)}, δ = {number_text(metadata.delta)}"
    else:
        bounds = f"biased, δ = {number_text(metadata.delta)}"
    return f"{direction} compressor: {group}={choice} ({name}, {metadata.dim:,} entries{memory}; {bounds})"


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
