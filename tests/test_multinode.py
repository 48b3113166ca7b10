"""Two machines simulated on one: ``torchrun --nnodes=2`` with one process per node gives the 1-process run.

Each node is its own ``torchrun --nnodes=2 --nproc-per-node=1 --node-rank=k`` launch on
127.0.0.1 (gloo on the CPU) of ``python -m fedlightning.cli ... trainer=ddp trainer.devices=1
trainer.num_nodes=2``, as it would be typed on each machine of a cluster; Lightning reads the
ranks and the world size from torchrun's environment. Each node has its own run folder, and only
the first process writes results. The checks are those of the 2-process runs of
``test_distributed.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from fedlightning.launch import free_port
from fedlightning.run import run

from .test_distributed import QUIET, final_state, records

FEDAVG = ["rounds=2"]  # FedAvg on the embedded digits, 10 clients (train.yaml's defaults)
NODES = ["trainer=ddp", "trainer.devices=1", "trainer.num_nodes=2"]


def torchrun_nodes(overrides: list[str], folders: list[Path], *, timeout: float = 300.0) -> None:
    """Launch ``fedlightning <overrides>`` on len(folders) simulated nodes, one process each; wait for all."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    port = free_port()
    procs = []
    try:
        for rank, folder in enumerate(folders):
            folder.mkdir(parents=True)
            command = [
                *(sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(folders)}", "--nproc-per-node=1"),
                *(f"--node-rank={rank}", "--master-addr=127.0.0.1", f"--master-port={port}"),
                *("-m", "fedlightning.cli", *QUIET, *overrides, f"hydra.run.dir={folder}"),
            ]
            with (folder.parent / f"{folder.name}.log").open("w") as log:
                procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
        codes = [proc.wait(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = {folder.name: (folder.parent / f"{folder.name}.log").read_text()[-3000:] for folder in folders}
    assert codes == [0] * len(folders), logs


@pytest.mark.slow
def test_two_nodes_of_one_process_reproduce_one_process_bits_and_model(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    one = run(make_config(FEDAVG), tmp_path / "one")
    torchrun_nodes([*FEDAVG, *NODES], [tmp_path / "node0", tmp_path / "node1"])
    two = json.loads((tmp_path / "node0" / "summary.json").read_text())
    assert two["processes"] == 2 and one["processes"] == 1
    for key in ("comm/uplink_bits_total", "comm/downlink_bits_total", "comm/uplink_messages", "rounds"):
        assert two[key] == one[key], key
    assert records(tmp_path / "node0") == records(tmp_path / "one")  # same cohort, same per-client bits
    assert two["test/acc"] == pytest.approx(one["test/acc"], abs=1e-6)
    a, b = final_state(tmp_path / "one"), final_state(tmp_path / "node0")
    assert a.keys() == b.keys()
    for name in a:  # float64 sums: summation order moves the float32 result by at most a few ulps
        assert torch.allclose(a[name].float(), b[name].float(), rtol=1e-5, atol=1e-6), name
    for written in ("summary.json", "comm_records.csv", "checkpoints"):  # the second node writes no results
        assert not (tmp_path / "node1" / written).exists(), written
