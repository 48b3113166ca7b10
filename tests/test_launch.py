"""The command starts the other processes of ``trainer=ddp`` early (``fedlightning.launch``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedlightning.launch import early_processes


@pytest.mark.parametrize(
    ("trainer", "env", "expected"),
    [
        ({"strategy": "ddp", "devices": 2}, {}, 2),
        ({"strategy": "ddp", "devices": "4", "num_nodes": 1}, {}, 4),
        ({"strategy": "ddp", "devices": 1}, {}, 0),
        ({"strategy": "ddp", "devices": 2, "num_nodes": 2}, {}, 0),  # several nodes: Lightning's own launch
        ({"strategy": "ddp", "devices": "auto"}, {}, 0),
        ({"strategy": "ddp", "devices": [0, 1]}, {}, 0),
        ({"strategy": "ddp_spawn", "devices": 2}, {}, 0),
        ({"strategy": "ddp", "devices": 2}, {"LOCAL_RANK": "1"}, 0),  # already started (by us or torchrun)
        ({"strategy": "ddp", "devices": 2}, {"SLURM_NTASKS": "2"}, 0),
    ],
)
def test_only_a_plain_single_node_ddp_run_is_started_early(trainer: dict, env: dict, expected: int) -> None:
    assert early_processes(trainer, env) == expected


def test_a_first_process_that_fails_before_training_ends_the_started_one(tmp_path: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("LOCAL_RANK", None)
    command = [
        sys.executable,
        "-m",
        "fedlightning.cli",
        "trainer=ddp",
        "logger=none",
        "trainer.enable_progress_bar=false",
        "method.batch_size=0",  # refused when the method is built, after the second process started
        f"hydra.run.dir={tmp_path}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 1
    assert "method.batch_size must be at least 1" in done.stderr  # and no process is left waiting (timeout)
