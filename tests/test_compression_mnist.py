"""Issue 4 "what must hold" on real MNIST (slow: several minutes on 2 CPU cores).

FedAvg, mnistfc, 10 IID clients, uplink compression of the model deltas:

* C_nat: uplink compression >= 3.5x (exactly 32/9) and test accuracy within 0.5 points of the
  uncompressed run after the same rounds (5);
* Top-1% + error feedback + 8-bit values: >= 100x and within 1.5 points after the same rounds
  (20; after only 5 rounds the gap is about 2 points, see benchmarks/results/compression.md).

Run with ``pytest -m slow tests/test_compression_mnist.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from fedlightning.run import run

pytestmark = pytest.mark.slow


def _fit(make_config: Any, tmp_path: Any, data_root: Any, rounds: int, *overrides: str) -> dict[str, Any]:
    cfg = make_config(
        [
            "data=mnist",
            "model=mnistfc",
            "partition=iid",
            f"rounds={rounds}",
            f"eval_every={rounds}",
            f"data.root={data_root}",
            "save_partition=false",
            *overrides,
        ]
    )
    return run(cfg, tmp_path / "_".join([str(rounds), *overrides]).replace("=", "-").replace("/", "-"))


def test_natural_compression_keeps_accuracy(make_config: Any, tmp_path: Any, shared_data_root: Any) -> None:
    base = _fit(make_config, tmp_path, shared_data_root, 5, "compressor=none")
    nat = _fit(make_config, tmp_path, shared_data_root, 5, "compressor=natural")
    assert nat["comm/uplink_compression"] == pytest.approx(32 / 9)
    assert nat["comm/uplink_compression"] >= 3.5
    assert nat["test/acc"] >= base["test/acc"] - 0.005


def test_top1pct_error_feedback_int8_over_100x(make_config: Any, tmp_path: Any, shared_data_root: Any) -> None:
    base = _fit(make_config, tmp_path, shared_data_root, 20, "compressor=none")
    top = _fit(make_config, tmp_path, shared_data_root, 20, "compressor=top_k_ef")
    assert top["comm/uplink_compression"] >= 100
    assert top["test/acc"] >= base["test/acc"] - 0.015
