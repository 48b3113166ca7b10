"""On CUDA every method config gives the CPU run's bits and, up to float rounding, its metrics.

Each config under ``configs/method/`` (found at collection, so a new one is covered) runs 2
rounds on the embedded digits data with 4 clients, once without an uplink compressor and once
with the first config of :data:`PREFERRED` that the method accepts, first with
``trainer.accelerator=cpu``, then with ``trainer.accelerator=gpu``. Both runs must write the same
``comm_records.csv`` (every message's round, client, direction, bits and codec) and final
metrics in ``summary.json`` that agree within :data:`ACC_TOL` (one prediction) and :data:`LOSS_RTOL`.

Without CUDA every test here skips; ``benchmarks/gpu_check.py`` runs them (``pytest -m gpu``) and
records the device. ``FEDLIGHTNING_GPU_CHECK_DEVICE=cpu`` makes the second run a CPU run too, so
the comparison itself can be exercised on a machine without a GPU::

    FEDLIGHTNING_GPU_CHECK_DEVICE=cpu pytest -m gpu -n 0 tests/test_gpu.py -k "fedavg-"
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.utils import get_class
from omegaconf import DictConfig

from fedlightning.errors import ConfigError
from fedlightning.run import compatible_compressors, run

from .conftest import CONFIG_DIR
from .test_distributed import records

SECOND = os.environ.get("FEDLIGHTNING_GPU_CHECK_DEVICE", "gpu")
"""The accelerator of the second run (``gpu`` unless the variable above says ``cpu``)."""

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(SECOND == "gpu" and not torch.cuda.is_available(), reason="needs CUDA"),
]

METHODS = sorted(p.stem for p in (CONFIG_DIR / "method").glob("*.yaml"))
SMALL = ["rounds=2", "eval_every=2", "data=digits", "data.num_clients=4"]
# What a method needs beyond SMALL to make 2 rounds on digits valid and quick (each config's comments):
# DCSGD and the DIANA family bound the smoothness from the data only for linear models; Local
# Zampling, continuous Zampling and the supermask are centralised (one client); the Zampling
# family scores a few sampled networks instead of 20-100. E-FLoPS-CNN differs from E-FLoPS only in
# its initial gates and runs on the default MLP (a CNN would add cuDNN's TF32 convolutions).
EXTRA: dict[str, list[str]] = {
    **{m: ["model=digits_logreg"] for m in ("dcsgd", "diana", "vr_diana")},
    "zampling": [
        "method.compression=4",
        "reports.zampling_evaluation.val_samples=2",
        "reports.zampling_evaluation.test_samples=2",
    ],
    "fedpm": ["reports.zampling_evaluation.val_samples=2"],
    **{
        m: [
            "data.num_clients=1",
            "reports.zampling_evaluation.val_samples=2",
            "reports.zampling_evaluation.test_samples=2",
        ]
        for m in ("local_zampling", "continuous_zampling", "supermask")
    },
}
# Uplink compressors to try, in order: unbiased and fixed-length first (every rule that refuses a
# pair, e.g. DIANA's need of an unbiased operator, accepts natural compression), then a sparsifier.
PREFERRED = ("natural", "qsgd", "rand_k", "top_k", "sign")
# Accuracies are counts over digits' 359 test and 144 validation samples: one prediction whose two
# top logits lie within float32 rounding of each other may flip between devices (1/359, 1/144), more
# would be a real difference. Losses are means of float32 terms whose order differs between devices.
ACC_TOL = {"test/": 0.003, "val/": 0.007}
LOSS_RTOL = 1e-3
COMM_TOTALS = ("comm/uplink_bits_total", "comm/downlink_bits_total", "comm/uplink_messages", "rounds")


def final_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The numeric validation and test metrics of a summary."""
    return {
        k: float(v)
        for k, v in summary.items()
        if k.startswith(("val/", "test/")) and isinstance(v, int | float) and not isinstance(v, bool)
    }


def compressors_to_try(method: str, cfg: DictConfig) -> list[str]:
    """The configs of :data:`PREFERRED` whose operator accepts the method's uplink payload."""
    payload = get_class(cfg.method._target_).uplink_payload
    fitting = set(compatible_compressors("compressor", payload))
    if not fitting & set(PREFERRED):
        pytest.skip(f"{method}'s uplink payload ({payload}) is accepted by none of {', '.join(PREFERRED)}")
    return [name for name in PREFERRED if name in fitting]


@pytest.mark.parametrize("case", ["none", "compressed"])
@pytest.mark.parametrize("method", METHODS)
def test_gpu_run_writes_the_cpu_runs_bits_and_metrics(
    method: str, case: str, make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    base = [*SMALL, f"method={method}", *EXTRA.get(method, [])]
    candidates = ["none"] if case == "none" else compressors_to_try(method, make_config(base))
    refusals: list[str] = []
    for compressor in candidates:  # a pair refused before training (ConfigError) yields to the next one
        overrides = [*base, f"compressor={compressor}"]
        a, b = tmp_path / compressor / "cpu", tmp_path / compressor / f"second_{SECOND}"
        try:
            first = run(make_config([*overrides, "trainer.accelerator=cpu"]), a)
        except ConfigError as refusal:
            if compressor == "none":
                raise
            refusals.append(f"{compressor}: {refusal}")
            continue
        break
    else:
        pytest.skip(f"{method} refuses every accepted compressor: {' | '.join(refusals)}")
    second = run(make_config([*overrides, f"trainer.accelerator={SECOND}"]), b)
    assert records(b) == records(a)  # every message's bits, codec and kind
    for key in COMM_TOTALS:
        assert second[key] == first[key], key
    want, got = final_metrics(first), final_metrics(second)
    assert got.keys() == want.keys() and "test/acc" in want, sorted(want)
    for key, value in want.items():
        tol = ACC_TOL[key[: key.index("/") + 1]]
        close = pytest.approx(value, rel=LOSS_RTOL) if key.endswith("loss") else pytest.approx(value, abs=tol)
        assert got[key] == close, (key, json.dumps({"cpu": want, SECOND: got}))
