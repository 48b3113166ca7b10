"""``run(cfg, output_dir)``: build everything from a composed config, fit, test, summarise.

No Hydra here beyond ``instantiate``: tests compose a config and call :func:`run` directly,
and the CLI (``fedlightning.cli``) is only a shell around it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.callbacks.bits_accuracy import BitsVsAccuracy, curve_title
from fedlightning.callbacks.compression import DownlinkCompression, UplinkCompression
from fedlightning.callbacks.declared import declared_callbacks
from fedlightning.callbacks.early_stopping import early_stopping_callback
from fedlightning.checkpointing import AtomicCheckpointIO, RoundCheckpoint, scalar_metrics
from fedlightning.console import RoundProgressBar, compressor_text, quiet_lightning, result_text
from fedlightning.errors import ConfigError, FedLightningError
from fedlightning.federated.channel import IncompatiblePayloadError
from fedlightning.federated.rng import SERVER, stream_seed
from fedlightning.folder_lock import make_folder
from fedlightning.launch import release_workers
from fedlightning.loggers import CSVLogger, WandbLogger
from fedlightning.models import ModelInputs
from fedlightning.preflight import instantiation_error, preflight, refusal_sentence
from fedlightning.preflight import refuse_missing_accelerator as refuse_missing_accelerator
from fedlightning.run_folder import (
    CHECKPOINTS,
    RUN_FILE,
    Resume,
    check_explicit_checkpoint,
    check_fits,
    checkpoint_metrics,
    checkpoint_round,
    claim,
    cut_back,
    latest_good_checkpoint,
    locked,
    missing_rows,
    read_partition_record,
    run_config,
    write_record,
    write_text_atomic,
)
from fedlightning.tracking import choice, flat_config, log_results, run_labels

log = logging.getLogger("fedlightning")

CONFIG_FILE = "config.yaml"
"""The resolved config of a run, written into its folder (printed too with ``print_config=true``)."""


def _build(node: Any, what: str, **kwargs: Any) -> Any:
    """Instantiate ``node``; a constructor's own validation error becomes one sentence in config names.

    Objects in ``kwargs`` are passed as they are (Hydra would turn a dataclass into a config).
    """
    try:
        factory = instantiate(node, _partial_=True)
    except InstantiationException as exc:
        raise instantiation_error(exc, what) from None
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


def configure_threads(threads: int | str | None) -> int:
    """Set torch's intra-op threads per process: ``auto``, a count, or ``None`` (keep torch's).

    ``auto`` takes one thread per process on a machine with at most two cores, where more
    threads per process oversubscribe the cores (several processes, or the data loader, share
    them), and keeps torch's default elsewhere. The choice and its reason are logged.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if threads == "auto":
        if cores <= 2:
            torch.set_num_threads(1)
            why = f"threads=auto: one per process on a machine with {cores} core(s)"
        else:
            why = f"threads=auto: torch's default on a machine with {cores} cores"
    elif threads is not None:
        torch.set_num_threads(int(threads))
        why = f"threads={threads}"
    else:
        why = "threads=null: torch's setting kept"
    n = torch.get_num_threads()
    log.info("Using %d torch thread(s) per process (%s).", n, why)
    return n


def _loggers(cfg: DictConfig, output_dir: Path, labels: Mapping[str, Any]) -> list[Any]:
    """The configured loggers; a W&B logger's ``group``/``name``/``tags``/``job_type`` left null get ``labels``."""
    loggers: list[Any] = []
    for name, node in (cfg.get("logger") or {}).items():
        if node is None:
            continue
        kwargs: dict[str, Any] = {"save_dir": str(output_dir)}
        if str(node.get("_target_", "")).endswith("WandbLogger"):
            kwargs.update({key: value for key, value in labels.items() if node.get(key) is None})
        loggers.append(_build(node, f"logger.{name}", **kwargs))
    return loggers


def run(
    cfg: DictConfig,
    output_dir: str | Path,
    *,
    choices: Mapping[str, str | None] | None = None,
    overrides: Sequence[str] = (),
    sweep_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Fit and test one federated run; write ``summary.json`` and plots into ``output_dir``.

    One run folder holds one run (see :mod:`fedlightning.run_folder`): its config is recorded
    in ``run.json``; the same config run again resumes from the folder's latest good checkpoint
    (or returns the recorded summary of a complete run), another config is refused.

    Args:
        cfg: a config composed from ``configs/train.yaml``.
        output_dir: folder for logs, checkpoints, ``summary.json`` and the bits/accuracy plot.
        choices: the config-group choices (``method``, ``data``, ...) for labelling results.
        overrides: the command-line overrides, recorded in the summary.
        sweep_dir: the sweep folder of a multirun job (it groups the job's W&B run).

    Returns:
        The summary dictionary (also written to ``summary.json``).
    """
    started = time.perf_counter()
    preflight(cfg, choices=choices, overrides=overrides)  # what the config decides: before any data or folder
    output_dir = make_folder(output_dir)  # one sentence for a folder that cannot be made
    manage = int(getattr(rank_zero_only, "rank", 0)) == 0  # the first process keeps the folder
    config = run_config(cfg)
    with locked(output_dir) if manage else contextlib.nullcontext():
        done = claim(output_dir, config)
        if done is not None:
            log.info(
                "The run in %s is already complete (summary.json): nothing is redone. "
                "Delete the folder or choose another one (hydra.run.dir=...) to run it again.",
                output_dir,
            )
            return done
        return _run(
            cfg,
            output_dir,
            config,
            started=started,
            manage=manage,
            choices=choices,
            overrides=overrides,
            sweep_dir=sweep_dir,
        )


def _run(
    cfg: DictConfig,
    output_dir: Path,
    config: dict[str, Any],
    *,
    started: float,
    manage: bool,
    choices: Mapping[str, str | None] | None,
    overrides: Sequence[str],
    sweep_dir: str | Path | None,
) -> dict[str, Any]:
    choices = dict(choices or {})
    quiet_lightning()
    configure_threads(cfg.get("threads"))
    early_stopping = early_stopping_callback(cfg.get("early_stopping"))  # its settings are checked before the data

    partition = _build(cfg.partition, "partition")
    datamodule = _build(cfg.data, "data", partition=partition, seed=int(cfg.seed))
    _user_errors("data", datamodule.prepare_data)
    _user_errors("data", datamodule.setup, "fit")

    data_name = choices.get("data") or getattr(datamodule, "name", type(datamodule).__name__)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed=int(cfg.seed), round_idx=0, client_id=SERVER, purpose="model_init"))
        inputs = ModelInputs(
            shape=tuple(int(s) for s in datamodule.input_shape),
            num_classes=int(datamodule.num_classes),
            data_name=data_name,
            token_inputs=getattr(datamodule, "token_inputs", None),  # None: a data module that does not say
        )
        model = _build(cfg.model, "model", inputs=inputs)
    module = _build(
        cfg.method,
        "method",
        model=model,
        datamodule=datamodule,
        seed=int(cfg.seed),
        local_execution=cfg.get("local_execution", "auto"),
    )
    budget_mb = cfg.get("client_state_memory_mb")
    if budget_mb is not None:  # spill per-client state beyond the budget into the run folder
        from fedlightning.federated.state import ClientStateStore

        spill_dir = output_dir / "client_state"
        module.client_state = ClientStateStore(memory_budget_bytes=int(budget_mb * 2**20), spill_dir=spill_dir)

    rounds = int(cfg.rounds)
    eval_every = min(int(cfg.get("eval_every", 1)), rounds)
    method_name = choices.get("method") or type(module).__name__.lower()
    accountant = CommunicationAccountant(records_path=output_dir / "comm_records.csv")
    score = f"val/{module.score_name}"
    title = curve_title(
        method=method_name,
        data=str(data_name),
        partition=datamodule.partition_name,
        compressor=choice(cfg, choices, "compressor"),
        downlink=choice(cfg, choices, "downlink"),
    )
    curve = BitsVsAccuracy(output_dir=output_dir, title=title, metric=score)
    checkpoints = _user_errors(
        "checkpoint_every",
        RoundCheckpoint,
        dirpath=output_dir / CHECKPOINTS,
        every=int(cfg.get("checkpoint_every") or 0),
        eval_every=eval_every,
        config=config,
    )
    callbacks: list[Any] = [_build(cfg.sampler, "sampler"), accountant, curve, checkpoints]
    for group in ("compressor", "downlink", "failures", "divergence"):  # compression, failure injection, guard
        node = cfg.get(group)
        if node and "_target_" in node:
            callback = _build(node, group)
            attach_compressor(callback, module, group, choices=choices)  # refuses a payload it does not take, now
            if isinstance(callback, (UplinkCompression, DownlinkCompression)) and callback.log_metadata:
                metadata = callback.channel(module).metadata(module.uplink_numel)
                log.info("%s", compressor_text(group=group, choice=choice(cfg, choices, group), metadata=metadata))
            callbacks.append(callback)
    if early_stopping is not None:
        callbacks.append(early_stopping)
    for name, node in (cfg.get("callbacks") or {}).items():
        if node is not None:
            callbacks.append(_build(node, f"callbacks.{name}"))
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(RoundProgressBar(score_name=module.score_name))
    callbacks.extend(declared_callbacks(module, settings=cfg.get("reports")))  # the method's reports (needed_callbacks)

    choices.setdefault("method", method_name)
    choices.setdefault("data", data_name)
    labels = run_labels(cfg, choices=choices, overrides=overrides, sweep_dir=sweep_dir)
    loggers = _loggers(cfg, output_dir, labels)
    metrics_files = [lg.metrics_file for lg in loggers if isinstance(lg, CSVLogger)]
    resume, source = _resume_point(cfg, output_dir, config, module, rounds, metrics_files)
    _check_resumed_split(output_dir, resume, datamodule, source)
    if manage:
        write_record(output_dir, config)
        # The resolved config, also for runs outside Hydra (whose .hydra/config.yaml is unresolved).
        write_text_atomic(output_dir / CONFIG_FILE, OmegaConf.to_yaml(cfg, resolve=True))
        _cut_back(output_dir, resume, source, loggers)
    # After the cut: a logger reads the metrics.csv it continues when its experiment starts.
    flat = flat_config(cfg, choices=choices, overrides=overrides)
    for logger in loggers:
        logger.log_hyperparams(flat)  # the resolved config, flattened (rank zero only)
    trainer: L.Trainer = _build(
        cfg.trainer,
        "trainer",
        max_steps=rounds,
        val_check_interval=eval_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        # With several processes the round loader must tick every round on each of them, and
        # each evaluates its own unpadded shard of the held-out sets (a distributed sampler
        # would pad them with repeats).
        use_distributed_sampler=False,
        logger=loggers or False,
        callbacks=callbacks,
        default_root_dir=str(output_dir),
        plugins=[AtomicCheckpointIO()],  # atomic writes, weights-only reads
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
    if cfg.get("print_config"):
        log.info("Config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))
    summary: dict[str, Any] = {}
    try:
        ckpt_path = str(resume.ckpt_path) if resume.ckpt_path is not None else None
        with warnings.catch_warnings():
            # The round loader has no position to restore: a round's number is the global step.
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
            release_workers()  # processes the command started early go on now (fedlightning.launch)
            trainer.fit(module, ckpt_path=ckpt_path, weights_only=True)  # the last round is validated in fit
        # A resumed run has seen only the rounds after its checkpoint: the checkpoint holds the rest.
        metrics = {**resume.metrics, **scalar_metrics(dict(trainer.callback_metrics))}
        trainer.test(module, verbose=False)  # resets callback_metrics: keep the fit metrics above
        module.client_state.close()  # spilled client state: the last checkpoint keeps it
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if _is_scalar(v)})
        summary = {
            "status": "completed",  # a failed job writes no summary.json (see fedlightning.jobs)
            "method": method_name,
            "data": data_name,
            "model": choice(cfg, choices, "model"),
            "partition": choices.get("partition") or getattr(partition, "name", None),
            "sampler": choices.get("sampler"),
            "rounds": trainer.global_step,
            "resumed_from_round": resume.round if resume.ckpt_path is not None else None,
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
            if cfg.get("save_partition", True):  # a figure: drawn after training, not in start-up
                from fedlightning.plotting.labels import plot_client_labels  # matplotlib, only when drawn

                plot_client_labels(datamodule, output_dir / "label_distribution.png")
            write_text_atomic(output_dir / "summary.json", json.dumps(_jsonable(summary), indent=2))
            for logger in loggers:
                if isinstance(logger, WandbLogger) and hasattr(logger.experiment, "log_artifact"):
                    log_results(
                        logger.experiment,
                        output_dir=output_dir,
                        points=curve.points,
                        metric=score,
                        targets=logger.accuracy_targets,
                    )
        if trainer.is_global_zero:  # the closing line once, not once per process
            log.info("%s | %s", result_text(summary, score_name=module.score_name), output_dir / "summary.json")
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


def _resume_point(
    cfg: DictConfig, output_dir: Path, config: dict[str, Any], module: Any, rounds: int, metrics_files: list[Path]
) -> tuple[Resume, Path | None]:
    """Where the run starts, checked before compute, and the run folder its rows come from.

    ``ckpt_path`` if given (checked: readable, this model and method, not past ``rounds``),
    else the latest good checkpoint of ``<output_dir>/checkpoints`` (readable, and its round's
    training row in ``metrics_files``), else round 0. The second value is the other run folder
    of a ``ckpt_path`` there (its CSVs seed this folder's).
    """
    explicit = cfg.get("ckpt_path")
    if explicit:
        path = Path(str(explicit)).expanduser()
        checkpoint = check_explicit_checkpoint(path)
    else:
        found = latest_good_checkpoint(
            output_dir / CHECKPOINTS,
            accept=lambda checkpoint: missing_rows(metrics_files, checkpoint_round(checkpoint)),
        )
        if found is None:
            return Resume(), None
        path, checkpoint = found
    check_fits(checkpoint, path=path, config=config, state_dict=module.state_dict(), rounds=rounds)
    resume = Resume(ckpt_path=path, round=checkpoint_round(checkpoint), metrics=checkpoint_metrics(checkpoint))
    log.info("Resuming from %s (round %d of %d).", path, resume.round, rounds)
    folder = path.resolve().parent.parent
    other = path.resolve().parent.name == CHECKPOINTS and (folder / RUN_FILE).is_file()
    return resume, folder if other and folder != output_dir.resolve() else None


def _check_resumed_split(output_dir: Path, resume: Resume, datamodule: Any, source: Path | None) -> None:
    """A resumed run keeps the clients and hold-out that its checkpoint's run folder records.

    From its own checkpoint the config on record already matches, so this catches a data module
    or partitioner whose draw changed since the run started; from a checkpoint of another run
    folder (``source``) it also catches a data or partition config other than that run's. Either
    way the remaining rounds would train on other samples than the checkpoint's.
    """
    if resume.ckpt_path is None:
        return
    own = resume.ckpt_path.resolve().parent == (output_dir / CHECKPOINTS).resolve()
    recorded = output_dir / "partition.json" if own else (source / "partition.json" if source else None)
    if recorded is None or not recorded.is_file():
        return
    fix = "start the run again in a new folder (hydra.run.dir=...)" if own else "drop ckpt_path"
    saved, now = read_partition_record(recorded, fix=fix), datamodule.partition_record()
    changed = [key for key in ("num_dataset_samples", "validation", "clients") if saved.get(key) != now.get(key)]
    if not changed:
        return
    what = " and ".join(changed)
    if own:
        raise ConfigError(
            f"{recorded} records other {what} than this version of the code draws for the same config (the data "
            f"module or partitioner changed since round {resume.round}), so resuming would train the remaining "
            "rounds on other samples; start the run again in a new folder (hydra.run.dir=...)."
        )
    raise ConfigError(
        f"ckpt_path={resume.ckpt_path} comes from a run whose {recorded.name} records other {what} than this "
        "run draws, so resuming would train the remaining rounds on other samples; resume with the data and "
        "partition settings of that run (its config.yaml), or start from round 0 without ckpt_path."
    )


def _cut_back(output_dir: Path, resume: Resume, source: Path | None, loggers: list[Any]) -> None:
    """Cut the run's CSVs back to the checkpoint's round, so each later round is appended once."""
    metrics_files = [lg.metrics_file for lg in loggers if isinstance(lg, CSVLogger)]
    if resume.round and any(type(lg).__name__ == "CSVLogger" and not isinstance(lg, CSVLogger) for lg in loggers):
        log.warning(
            "Lightning's own CSVLogger starts metrics.csv afresh on resume; use logger=csv "
            "(fedlightning.loggers.CSVLogger) to keep the rows of the first %d rounds.",
            resume.round,
        )
    if resume.ckpt_path is not None and source is None and not (output_dir / "comm_records.csv").exists():
        log.info("The CSVs of %s start after round %d, the round of ckpt_path.", output_dir, resume.round)
    cut_back(output_dir, resume.round, metrics_files, source=source)


def attach_compressor(
    callback: Any, module: Any, group: str, *, choices: Mapping[str, str | None] | None = None
) -> None:
    """Attach a ``compressor=``/``downlink=`` callback's operator to the module's channel, or refuse.

    The refusal names the method and compressor by their config choices when ``choices`` has them,
    and the compressor configs of ``group`` that fit (as :func:`fedlightning.preflight.preflight` does).
    """
    attach = getattr(callback, "attach", None)
    if attach is None:
        return
    try:
        attach(module)
    except IncompatiblePayloadError as exc:
        raise ConfigError(refusal_sentence(exc, type(module), group, choices=choices)) from None


def compatible_compressors(group: str, payload: Any) -> list[str]:
    """Names of the configs under ``configs/<group>/`` whose operator accepts ``payload``."""
    from hydra.utils import get_class

    from fedlightning.paths import config_dir

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
