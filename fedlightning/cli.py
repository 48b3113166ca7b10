"""The ``fedlightning`` command: a Hydra shell around :func:`fedlightning.run.run`.

Configs live in the top-level ``configs/`` folder of a source checkout and are shipped inside
the wheel as ``fedlightning/configs``, so ``pip install .`` runs the same job.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from fedlightning.errors import FedLightningError


def config_dir() -> str:
    """The config folder: the wheel's packaged copy, else the checkout's ``configs/``."""
    packaged = Path(__file__).resolve().parent / "configs"
    if packaged.is_dir():
        return str(packaged)
    return str(Path(__file__).resolve().parents[1] / "configs")


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Run one job; returns the test accuracy (for Hydra sweepers)."""
    from fedlightning.run import run

    hc = HydraConfig.get()
    try:
        summary = run(cfg, hc.runtime.output_dir, choices=dict(hc.runtime.choices), overrides=list(hc.overrides.task))
    except FedLightningError as exc:
        if hc.mode == RunMode.MULTIRUN:
            raise  # Hydra records the failed job and runs the others
        logging.getLogger("fedlightning").error("%s", exc)
        print(f"fedlightning: error: {exc}", file=sys.stderr)
        sys.exit(1)
    return summary.get("test/acc")


if __name__ == "__main__":
    main()
