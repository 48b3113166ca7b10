"""The ``fedlightning`` command: a Hydra shell around :func:`fedlightning.run.run`.

Configs live in the top-level ``configs/`` folder of a source checkout and are shipped inside
the wheel as ``fedlightning/configs``, so ``pip install .`` runs the same job.

Every error the user can fix ends the command with exit status 1 and one line on stderr,
``fedlightning: error: <sentence>``: a config that does not compose (``method=fedavgg``), one that
fails :func:`fedlightning.schema.validate_config`, or a run that stops with a
:class:`~fedlightning.errors.FedLightningError`. The job's folder keeps the record
(``status.json``, ``error.txt``, ``cli.log``; see :mod:`fedlightning.jobs`). A multirun runs
every job and ends with the list of failed jobs. ``HYDRA_FULL_ERROR=1`` shows Hydra's own
messages and tracebacks instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from hydra.utils import get_original_cwd
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from fedlightning import lean_imports
from fedlightning.errors import FedLightningError

FULL_ERROR = "HYDRA_FULL_ERROR"


def config_dir() -> str:
    """The config folder: the wheel's packaged copy, else the checkout's ``configs/``."""
    packaged = Path(__file__).resolve().parent / "configs"
    if packaged.is_dir():
        return str(packaged)
    return str(Path(__file__).resolve().parents[1] / "configs")


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def job(cfg: DictConfig) -> float | None:
    """Run one job and record its status in its folder; returns the test accuracy (for sweepers)."""
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
        sentence = record_failure(output_dir, exc, overrides=overrides)
        if hc.mode == RunMode.MULTIRUN or not isinstance(exc, FedLightningError):
            raise  # a sweep records the failed job and runs the others; a bug keeps its traceback
        _fail(sentence)
    finally:
        if workers is not None:  # wait for the other processes, or stop them if this one failed
            workers.finish(failed=failed)
    if all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "NODE_RANK")):
        record_success(output_dir, overrides=overrides)  # one process writes results (as run() does)
    return summary.get("test/acc")


def _fail(sentence: str) -> None:
    print(f"fedlightning: error: {sentence}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    """The console entry point: :func:`job` with its errors told in one sentence."""
    lean_imports.install()  # torchmetrics without torchvision, matplotlib and scipy.signal
    if os.environ.get(FULL_ERROR) == "1":
        job()
        return
    from fedlightning.jobs import error_sentence

    # Hydra prints a composition error over several lines (or a traceback) and exits itself
    # unless HYDRA_FULL_ERROR is set; set, it lets the error reach us.
    os.environ[FULL_ERROR] = "1"
    try:
        job()
    except (FedLightningError, HydraException, OmegaConfBaseException) as exc:
        _fail(error_sentence(exc))
    finally:
        os.environ.pop(FULL_ERROR, None)


if __name__ == "__main__":
    main()
