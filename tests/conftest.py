"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shared_data_root() -> Path:
    """The offline copy of the real data sets (``$FEDLIGHTNING_TEST_DATA``, default ``../shared/data``).

    Skips the test when the folder is absent.
    """
    root = Path(os.environ.get("FEDLIGHTNING_TEST_DATA", REPO_ROOT.parent / "shared" / "data")).resolve()
    if not root.is_dir():
        pytest.skip(f"shared data not found at {root}; set FEDLIGHTNING_TEST_DATA to the folder holding MNIST/raw")
    return root
