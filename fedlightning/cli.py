"""The ``fedlightning`` command: a Hydra shell around :func:`fedlightning.run.run`.

Configs live in the top-level ``configs/`` folder of a source checkout and are shipped inside
the wheel as ``fedlightning/configs``, so ``pip install .`` runs the same job.

Every error the user can fix ends the command with exit status 1 and one line on stderr,
``fedlightning: error: <sentence>``, printed once. A config that does not compose
(``method=fedavgg``) or that the pre-flight refuses (:mod:`fedlightning.preflight`: the schema,
the trainer's devices, a method × compressor pair) is refused before the run folder is made, so
it leaves none. A run that stops later with a :class:`~fedlightning.errors.FedLightningError`
leaves the record in its folder (``status.json``, ``error.txt``, ``cli.log``; see
:mod:`fedlightning.jobs`). A multirun runs
every job and ends with the list of failed jobs. ``HYDRA_FULL_ERROR=1`` shows Hydra's own
messages and tracebacks instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from hydra.utils import get_original_cwd
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from fedlightning.errors import FedLightningError
from fedlightning.paths import config_dir

FULL_ERROR = "HYDRA_FULL_ERROR"


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def job(cfg: DictConfig) -> float | None:
    """Run one job and record its status in its folder; returns the test accuracy (for sweepers).

    The first process holds the run folder before anything is written into it, and writes its
    records there (Hydra's ``.hydra/``, ``status.json``, ``error.txt``) only once the folder is
    this run's: a folder another run holds, or one of another config, is left untouched
    (:mod:`fedlightning.folder_lock`).
    """
    from fedlightning.folder_lock import hold

    hc = HydraConfig.get()
    output_dir = hc.runtime.output_dir
    with contextlib.ExitStack() as folder:
        if all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "NODE_RANK")):
            try:
                folder.enter_context(hold(output_dir, on_writable=lambda: _save_hydra_files(output_dir, cfg)))
            except FedLightningError as exc:  # held by another run, or not writable: nothing written
                if hc.mode == RunMode.MULTIRUN:
                    raise
                _fail(str(exc))
        return _job(cfg)


def _save_hydra_files(output_dir: str, cfg: DictConfig) -> None:
    """Hydra's ``.hydra/`` records of the job, written once the folder is the job's.

    ``hydra.output_subdir`` is null in ``configs/hydra/default.yaml``, so Hydra does not write
    them before the job starts (over the records of a run that holds the folder).
    """
    from omegaconf import OmegaConf

    from fedlightning.folder_lock import write_text_atomic

    hydra_cfg: Any = HydraConfig.instance().cfg  # a DictConfig with the ``hydra`` node
    if hydra_cfg is None or OmegaConf.select(hydra_cfg, "hydra.output_subdir") is not None:
        return  # Hydra wrote them itself
    folder = Path(output_dir) / ".hydra"
    write_text_atomic(folder / "config.yaml", OmegaConf.to_yaml(cfg))
    write_text_atomic(folder / "hydra.yaml", OmegaConf.to_yaml(hydra_cfg))
    write_text_atomic(folder / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.select(hydra_cfg, "hydra.overrides.task")))


def _job(cfg: DictConfig) -> float | None:
    from fedlightning import launch
    from fedlightning.jobs import record_failure, record_success
    from fedlightning.schema import validate_top_level

    hc = HydraConfig.get()
    output_dir = hc.runtime.output_dir
    overrides = list(hc.overrides.task)
    workers = None
    failed = True
    try:
        validate_top_level(cfg)  # before torch and Lightning are imported: a typo costs a second
        processes = launch.early_processes(cfg.trainer, os.environ) if hc.mode == RunMode.RUN else 0
        if processes:  # the other processes import while this one does (see fedlightning.launch)
            workers = launch.start_workers(
                processes, run_dir=str(output_dir), cwd=get_original_cwd(), argv=sys.argv[1:]
            )
        from fedlightning.run import run

        if not launch.wait_for_release():
            return None  # a started process whose first process stopped before training (it says why)
        sweep_dir = Path(output_dir).parent if hc.mode == RunMode.MULTIRUN else None  # <sweep dir>/<job number>
        summary = run(cfg, output_dir, choices=dict(hc.runtime.choices), overrides=overrides, sweep_dir=sweep_dir)
        failed = False
    except Exception as exc:
        told = hc.mode == RunMode.RUN and isinstance(exc, FedLightningError)  # _fail tells it on stderr
        log_file = _log_file(output_dir) if told else None
        sentence = record_failure(output_dir, exc, overrides=overrides, log_file=log_file)
        if hc.mode == RunMode.MULTIRUN or not isinstance(exc, FedLightningError):
            raise  # a sweep records the failed job and runs the others; a bug keeps its traceback
        _fail(sentence)
    finally:
        if workers is not None:  # wait for the other processes, or stop them if this one failed
            workers.finish(failed=failed)
    if all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "NODE_RANK")):
        record_success(output_dir, overrides=overrides)  # one process writes results (as run() does)
    return summary.get("test/acc")


def _log_file(output_dir: str) -> str | None:
    """The name of the job's log file in ``output_dir`` (Hydra's ``<job name>.log``), if logging writes one there.

    A sentence the command prints itself goes to this file directly, not through the logger,
    whose console handler would print it a second time.
    """
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == Path(output_dir).resolve():
            return Path(handler.baseFilename).name
    return None


def _fail(sentence: str) -> None:
    print(f"fedlightning: error: {sentence}", file=sys.stderr)
    sys.exit(1)


def _sentence(exc: BaseException) -> str:
    """:func:`fedlightning.jobs.error_sentence` of ``exc``, its hints read from the target index where it answers.

    A misspelt key's hint may name a key a target takes (``did you mean +method.seed=...?``);
    the index answers that without importing the target's module (:mod:`fedlightning.target_index`).
    """
    from fedlightning import target_index
    from fedlightning.jobs import error_sentence
    from fedlightning.schema import reading_records

    held = target_index.load() if not isinstance(exc, FedLightningError) else None
    if held is not None:
        try:
            with reading_records(held):
                return error_sentence(exc)
        except Exception as failure:  # the index cannot answer: the classes can
            logging.getLogger(__name__).debug("error sentence from the target index failed (%r)", failure)
    return error_sentence(exc)


def preflight_command(argv: list[str]) -> None:
    """Check the config of a plain run before Hydra makes its run folder (:mod:`fedlightning.preflight`).

    The config is composed as :func:`job` will compose it; a refusal leaves no folder behind and
    is told once, by :func:`main`. A multirun (whose jobs each record their refusal in their own
    folder), a command that runs no job (``--cfg``, ``--help``, ``--info``), another config
    (``--config-name``/``--config-path``/``--config-dir``) and a process started by the first one
    (:mod:`fedlightning.launch`) are left to :func:`job`, which runs the same checks in
    :func:`fedlightning.run.run`.

    The checks run first on the targets' records (:mod:`fedlightning.target_index`), which needs
    no Lightning, then on the classes themselves; the second pass imports what the job imports
    next, and then records the targets for the next command if their index is missing.
    """
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from omegaconf import open_dict

    from fedlightning.launch import START_FD

    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:  # malformed flags: Hydra's own parser tells them
        return
    elsewhere = (args.config_path, args.config_name, args.config_dir, args.experimental_rerun, args.info, args.cfg)
    if args.multirun or args.help or args.hydra_help or args.shell_completion or any(elsewhere):
        return
    if START_FD in os.environ:
        return
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=args.overrides, return_hydra_config=True)
    if cfg.hydra.mode == RunMode.MULTIRUN:  # hydra.mode=MULTIRUN in an override or an experiment
        return
    choices = {str(k): v for k, v in cfg.hydra.runtime.choices.items()}
    overrides = [str(o) for o in cfg.hydra.overrides.task]
    with open_dict(cfg):
        del cfg["hydra"]
    from fedlightning import target_index
    from fedlightning.preflight import preflight

    held = target_index.load()
    if held is not None:  # the targets' records: a refusal before Lightning is imported
        with target_index.record_pass(held):
            preflight(cfg, choices=choices, overrides=overrides)
    try:
        preflight(cfg, choices=choices, overrides=overrides)  # the classes themselves
    finally:
        target_index.ensure()  # the targets are imported now: record them for the next command


def main() -> None:
    """The console entry point: :func:`job` with its errors told in one sentence."""
    if os.environ.get(FULL_ERROR) == "1":
        preflight_command(sys.argv[1:])
        job()
        return
    # Hydra prints a composition error over several lines (or a traceback) and exits itself
    # unless HYDRA_FULL_ERROR is set; set, it lets the error reach us.
    os.environ[FULL_ERROR] = "1"
    try:
        preflight_command(sys.argv[1:])  # what the config decides, before the run folder is made
        job()
    except (FedLightningError, HydraException, OmegaConfBaseException) as exc:
        _fail(_sentence(exc))
    except OSError as exc:  # Hydra could not make the run folder or open its log there
        from fedlightning.folder_lock import write_failure

        failure = write_failure(exc, path=exc.filename or "the run folder")
        if failure is None:
            raise
        _fail(str(failure))
    finally:
        os.environ.pop(FULL_ERROR, None)


if __name__ == "__main__":
    main()
