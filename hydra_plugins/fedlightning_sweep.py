"""Hydra sweeper and launcher of fedlightning: a failed job is recorded and the sweep goes on.

Hydra finds plugins only in the ``hydra_plugins`` namespace package, hence this module; the
records themselves are written by :mod:`fedlightning.jobs`. Selected in ``configs/train.yaml``
(``override hydra/sweeper: fedlightning``, ``override hydra/launcher: fedlightning``).

Hydra's basic sweeper composes every job before launching any (so one job whose config does
not compose aborts the sweep) and re-raises the first failed job's error; the basic launcher
stops at a job whose config does not compose. Here each job composes in the launcher, a job
that cannot is recorded in its own folder as failed, and the sweeper raises
:class:`fedlightning.jobs.SweepFailedError` listing every failed job once all have run.

The sweeper also drives Hydra's other launchers (``hydra/launcher=joblib``, ``submitit_slurm``;
configs in ``configs/hydra/launcher/``): it composes each job first, records the ones that do
not compose, and hands the others to the launcher in runs of consecutive job numbers, so every
job keeps its number and folder. A job that fails while running records itself: the task
function (:func:`fedlightning.cli.job`) writes ``status.json`` and ``error.txt`` in the job's own
process. The grid is the product of ``hydra.sweeper.params`` (an experiment config can carry
its paper's grid) and the command line; a key given on the command line replaces that key of
``params``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


@dataclass
class RecordedJobReturn(JobReturn):
    """A job's result whose failure is already on record: reading it does not raise."""

    @property  # type: ignore[override]
    def return_value(self) -> Any:
        return self._return_value

    @return_value.setter
    def return_value(self, value: Any) -> None:
        self._return_value = value


def _recorded(ret: JobReturn) -> JobReturn:
    if ret.status != JobStatus.FAILED:
        return ret
    return RecordedJobReturn(
        overrides=ret.overrides,
        cfg=ret.cfg,
        hydra_cfg=ret.hydra_cfg,
        working_dir=ret.working_dir,
        task_name=ret.task_name,
        status=ret.status,
        _return_value=ret._return_value,
    )


def _job_dir(ret: JobReturn) -> str:
    """The job's output folder (``working_dir`` is the process's cwd unless Hydra changed into it)."""
    if ret.hydra_cfg is not None:
        output_dir = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir")
        if output_dir:
            return str(output_dir)
    return str(ret.working_dir)


def _subdir(config: DictConfig, num: int) -> str:
    """The job's sub-folder as the sweep config names it (``${hydra.job.num}`` by default)."""
    config = copy.deepcopy(config)
    try:
        with open_dict(config):
            config.hydra.job.num = num
            config.hydra.job.id = num
        return str(config.hydra.sweep.subdir)
    except Exception:  # a subdir that needs the job's own config: fall back to its number
        return str(num)


def composition_failure(config: DictConfig, num: int, overrides: Sequence[str], exc: Exception) -> JobReturn:
    """Record job ``num``, whose config did not compose, as failed in its folder; its result."""
    from fedlightning.jobs import record_failure

    job_dir = Path(str(config.hydra.sweep.dir)) / _subdir(config, num)
    name = str(config.hydra.job.get("name") or "job")
    sentence = record_failure(job_dir, exc, overrides=list(overrides), log_file=f"{name}.log")
    log.error(f"\t#{num} failed before it started: {sentence}")
    return RecordedJobReturn(
        overrides=list(overrides),
        working_dir=str(job_dir),
        task_name=name,
        status=JobStatus.FAILED,
        _return_value=exc,
    )


class FedLightningLauncher(BasicLauncher):
    """Runs the jobs one after another in this process; a job that fails to compose is recorded."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs locally")
        results: list[JobReturn] = []
        for offset, overrides in enumerate(job_overrides):
            num = initial_job_idx + offset
            log.info(f"\t#{num} : {' '.join(filter_overrides(overrides))}")
            try:
                job_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            except Exception as exc:  # recorded in the job's folder; the other jobs still run
                results.append(composition_failure(self.config, num, overrides, exc))
                continue
            with open_dict(job_config):
                job_config.hydra.job.id = num
                job_config.hydra.job.num = num
            ret = run_job(
                hydra_context=self.hydra_context,
                task_function=self.task_function,
                config=job_config,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )
            results.append(_recorded(ret))
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return results


class FedLightningSweeper(BasicSweeper):
    """Hydra's basic grid sweeper that runs every job and reports all failures at the end."""

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Nothing here: each job composes before it is launched, and the ones that cannot are recorded."""

    def job_overrides(self, arguments: Sequence[str]) -> list[list[str]]:
        """Every job's overrides in launch order: the grid of ``hydra.sweeper.params`` and ``arguments``."""
        loader = self.hydra_context.config_loader if self.hydra_context is not None else None
        parser = OverridesParser.create(config_loader=loader)
        parsed = parser.parse_overrides([*self._parse_config(), *arguments])
        return [job for batch in self.split_arguments(parsed, None) for job in batch]

    def sweep(self, arguments: list[str]) -> Any:
        from fedlightning.jobs import error_sentence, sweep_failed

        assert self.config is not None
        jobs = self.job_overrides(arguments)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        size = self.max_batch_size if self.max_batch_size and self.max_batch_size > 0 else max(len(jobs), 1)
        results: list[JobReturn] = []
        for start in range(0, len(jobs), size):
            results += self._launch(jobs[start : start + size], start)
        shared = set.intersection(*(set(ret.overrides or []) for ret in results)) if len(results) > 1 else set()
        failures = [
            (num, _job_dir(ret), [o for o in ret.overrides or [] if o not in shared], error_sentence(ret._return_value))
            for num, ret in enumerate(results)
            if ret.status == JobStatus.FAILED
        ]
        if failures:
            raise sweep_failed(failures, len(results))
        return [results]

    def _launch(self, batch: list[list[str]], first: int) -> list[JobReturn]:
        """Launch one batch; another launcher gets only the jobs that compose, their numbers kept."""
        assert self.launcher is not None and self.config is not None and self.hydra_context is not None
        if isinstance(self.launcher, FedLightningLauncher):
            return [_recorded(ret) for ret in self.launcher.launch(batch, initial_job_idx=first)]
        results: list[JobReturn | None] = []
        for num, overrides in enumerate(batch, start=first):
            try:
                self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            except Exception as exc:  # the launcher would abort the whole sweep on it
                results.append(composition_failure(self.config, num, overrides, exc))
            else:
                results.append(None)
        start = 0
        while start < len(batch):  # each run of composable jobs, launched under its first number
            if results[start] is not None:
                start += 1
                continue
            end = start
            while end < len(batch) and results[end] is None:
                end += 1
            launched = self.launcher.launch(batch[start:end], initial_job_idx=first + start)
            results[start:end] = [_recorded(ret) for ret in launched]
            start = end
        return [ret for ret in results if ret is not None]
