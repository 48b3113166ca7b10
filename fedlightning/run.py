"""``run(cfg, output_dir)``: build everything from a composed config, fit, test, summarise.

No Hydra here beyond ``instantiate``: tests compose a config and call :func:`run` directly,
and the CLI (``fedlightning.cli``) is only a shell around it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.callbacks.bits_accuracy import BitsVsAccuracy
from fedlightning.errors import ConfigError, FedLightningError
from fedlightning.federated.channel import IncompatiblePayloadError
from fedlightning.federated.rng import SERVER, stream_seed
from fedlightning.models import build_model
from fedlightning.schema import validate_config

log = logging.getLogger("fedlightning")


def _build(node: Any, what: str, **kwargs: Any) -> Any:
    """Instantiate ``node``; a constructor's own validation error becomes one sentence.

    Objects in ``kwargs`` are passed as they are (Hydra would turn a dataclass into a config).
    """
    try:
        factory = instantiate(node, _partial_=True)
    except InstantiationException as exc:
        raise ConfigError(f"Could not build {what} from its config ({exc}); check {what}._target_.") from None
    return _user_errors(what, factory, **kwargs)


def _user_errors(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; ``ValueError``/``TypeError`` from bad settings become a ``ConfigError``."""
    try:
        return fn(*args, **kwargs)
    except FedLightningError:
        raise
    except TypeError as exc:  # an unknown or missing constructor argument
        raise ConfigError(f"Could not build {what}: {exc}; check the keys under {what}.") from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def configure_threads(threads: int | None) -> int:
    """One intra-op thread per process unless told otherwise (measured fastest here)."""
    if threads is not None:
        torch.set_num_threads(int(threads))
    n = torch.get_num_threads()
    log.info(
        "Using %d torch thread(s) per process (threads=%s; one thread measured fastest for these "
        "model sizes on a 2-core CPU; more threads per process oversubscribe the cores).",
        n,
        threads,
    )
    return n


def _loggers(cfg: DictConfig, output_dir: Path) -> list[Any]:
    loggers: list[Any] = []
    for name, node in (cfg.get("logger") or {}).items():
        if node is None:
            continue
        kwargs: dict[str, Any] = {"save_dir": str(output_dir)}
        loggers.append(_build(node, f"logger.{name}", **kwargs))
    return loggers


def run(
    cfg: DictConfig,
    output_dir: str | Path,
    *,
    choices: Mapping[str, str | None] | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Fit and test one federated run; write ``summary.json`` and plots into ``output_dir``.

    Args:
        cfg: a config composed from ``configs/train.yaml``.
        output_dir: folder for logs, checkpoints, ``summary.json`` and the bits/accuracy plot.
        choices: the config-group choices (``method``, ``data``, ...) for labelling results.
        overrides: the command-line overrides, recorded in the summary.

    Returns:
        The summary dictionary (also written to ``summary.json``).
    """
    started = time.perf_counter()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    validate_config(cfg)
    choices = dict(choices or {})
    configure_threads(cfg.get("threads"))

    partition = _build(cfg.partition, "partition")
    datamodule = _build(cfg.data, "data", partition=partition, seed=int(cfg.seed))
    _user_errors("data", datamodule.prepare_data)
    _user_errors("data", datamodule.setup, "fit")

    data_name = choices.get("data") or getattr(datamodule, "name", type(datamodule).__name__)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed=int(cfg.seed), round_idx=0, client_id=SERVER, purpose="model_init"))
        model_cfg = {str(k): v for k, v in dict(OmegaConf.to_container(cfg.model, resolve=True)).items()}  # type: ignore[arg-type]
        model = _user_errors(
            "model",
            build_model,
            **model_cfg,
            input_shape=tuple(datamodule.input_shape),
            num_classes=datamodule.num_classes,
            data_name=data_name,
        )
    module = _build(cfg.method, "method", model=model, datamodule=datamodule, seed=int(cfg.seed))

    method_name = choices.get("method") or type(module).__name__.lower()
    accountant = CommunicationAccountant(records_path=output_dir / "comm_records.csv")
    score = f"val/{module.score_name}"
    curve = BitsVsAccuracy(output_dir=output_dir, title=f"{method_name} on {data_name}", metric=score)
    checkpoints = ModelCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="round-{step:04d}",
        auto_insert_metric_name=False,  # no "=" in file names: they must pass as ckpt_path=... overrides
        every_n_train_steps=int(cfg.get("checkpoint_every", 0)) or None,
        save_top_k=-1,
        save_last=True,
    )
    callbacks: list[Any] = [_build(cfg.sampler, "sampler"), accountant, curve, checkpoints]
    for group in ("compressor", "downlink", "failures", "divergence"):  # compression, failure injection, guard
        node = cfg.get(group)
        if node and "_target_" in node:
            callback = _build(node, group)
            attach_compressor(callback, module, group)  # refuses a payload it does not understand, now
            callbacks.append(callback)
    for name, node in (cfg.get("callbacks") or {}).items():
        if node is not None:
            callbacks.append(_build(node, f"callbacks.{name}"))

    loggers = _loggers(cfg, output_dir)
    rounds = int(cfg.rounds)
    eval_every = min(int(cfg.get("eval_every", 1)), rounds)
    trainer: L.Trainer = _build(
        cfg.trainer,
        "trainer",
        max_steps=rounds,
        val_check_interval=eval_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        # With several processes the round loader must tick every round on each of them, and
        # each evaluates the full held-out sets (a distributed sampler would pad them).
        use_distributed_sampler=False,
        logger=loggers or False,
        callbacks=callbacks,
        default_root_dir=str(output_dir),
    )
    if trainer.is_global_zero and cfg.get("save_partition", True):
        datamodule.save_partition(output_dir / "partition.json")
        datamodule.write_client_summary(output_dir / "clients.csv")
    log.info("Run folder: %s", output_dir)
    log.info(
        "Aggregation: %s estimator over the uploaders (method.aggregation); %d process(es) share the cohort.",
        module.aggregation,
        trainer.world_size,
    )
    log.info("Config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))
    summary: dict[str, Any] = {}
    try:
        ckpt_path = cfg.get("ckpt_path")
        trainer.fit(module, ckpt_path=str(ckpt_path) if ckpt_path else None)
        if trainer.global_step % eval_every != 0:  # the last round was not evaluated yet
            trainer.validate(module, verbose=False)
            curve.write()
        trainer.save_checkpoint(output_dir / "checkpoints" / "last.ckpt")
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if _is_scalar(v)}
        trainer.test(module, verbose=False)  # resets callback_metrics: keep the fit metrics above
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if _is_scalar(v)})
        summary = {
            "status": "completed",  # a failed job writes no summary.json (see fedlightning.jobs)
            "method": method_name,
            "data": data_name,
            "model": choices.get("model") or cfg.model.get("name"),
            "partition": choices.get("partition") or getattr(partition, "name", None),
            "sampler": choices.get("sampler"),
            "rounds": trainer.global_step,
            "seed": int(cfg.seed),
            "num_clients": datamodule.num_clients,
            "aggregation": module.aggregation,
            "processes": trainer.world_size,
            "test/acc": metrics.get("test/acc"),
            "test/loss": metrics.get("test/loss"),
            "val/acc": metrics.get("val/acc"),
            "val/acc_best": metrics.get("val/acc_best"),
            **accountant.summary(),
            **module.reliability_summary(),  # failures/*, divergence/* totals
            "time/wall_s": time.perf_counter() - started,
            "torch_threads": torch.get_num_threads(),
            "data_notice": getattr(datamodule, "notice", None) or None,
            "overrides": list(overrides),
            "config": OmegaConf.to_container(cfg, resolve=True),
        }
        summary.update(
            {k: v for k, v in metrics.items() if k.startswith(("test/", "val/", "model/")) and k not in summary}
        )
        if trainer.is_global_zero:  # one process writes the results
            (output_dir / "summary.json").write_text(json.dumps(_jsonable(summary), indent=2))
        log.info(
            "test/%s %.4f | uplink %d bits (%.3gx vs float32) | downlink %d bits | %.1f s | %s",
            module.score_name,
            summary.get(f"test/{module.score_name}") or float("nan"),
            summary["comm/uplink_bits_total"],
            summary["comm/uplink_compression"],
            summary["comm/downlink_bits_total"],
            summary["time/wall_s"],
            output_dir / "summary.json",
        )
    finally:
        for logger in loggers:
            try:
                logger.finalize("success" if summary else "failed")
            except Exception:  # a logger that cannot close must not hide the run's own error
                log.exception("Closing logger %s failed", type(logger).__name__)
        if any(type(lg).__name__ == "WandbLogger" for lg in loggers):
            import wandb

            wandb.finish(exit_code=0 if summary else 1)
    return summary


def attach_compressor(callback: Any, module: Any, group: str) -> None:
    """Attach a ``compressor=``/``downlink=`` callback's operator to the module's channel, or refuse.

    The refusal names the compressor configs of ``group`` that accept the method's payload.
    """
    attach = getattr(callback, "attach", None)
    if attach is None:
        return
    try:
        attach(module)
    except IncompatiblePayloadError as exc:
        fitting = compatible_compressors(group, callback.channel(module).compressed_payload)
        raise ConfigError(exc.sentence(fitting=fitting)) from None


def compatible_compressors(group: str, payload: Any) -> list[str]:
    """Names of the configs under ``configs/<group>/`` whose operator accepts ``payload``."""
    from hydra.utils import get_class

    from fedlightning.cli import config_dir

    names = []
    for path in sorted((Path(config_dir()) / group).glob("*.yaml")):
        node = OmegaConf.load(path)
        target = OmegaConf.select(node, "compressor._target_")
        if target is None:
            continue
        if payload in getattr(get_class(target), "accepts", frozenset()):
            names.append(path.stem)
    return names


def _is_scalar(value: Any) -> bool:
    return (isinstance(value, torch.Tensor) and value.numel() == 1) or isinstance(value, int | float)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf/nan; keep them readable
    if isinstance(value, Path | os.PathLike):
        return str(value)
    return value
