"""The NVML-based CUDA check that Lightning switches on is dropped only where NVML cannot load."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedlightning.cuda_check import NVML_CHECK, drop_unusable_nvml_check, nvml_loads


def test_the_variable_is_dropped_only_when_nvml_cannot_load() -> None:
    environ = {NVML_CHECK: "1", "OTHER": "x"}
    assert drop_unusable_nvml_check(environ, nvml_available=lambda: True) is False
    assert environ == {NVML_CHECK: "1", "OTHER": "x"}
    assert drop_unusable_nvml_check(environ, nvml_available=lambda: False) is True
    assert environ == {"OTHER": "x"}
    assert drop_unusable_nvml_check(environ, nvml_available=lambda: False) is False  # nothing left to drop


def test_a_value_other_than_one_is_left_alone() -> None:
    environ = {NVML_CHECK: "0"}
    assert drop_unusable_nvml_check(environ, nvml_available=lambda: False) is False
    assert environ == {NVML_CHECK: "0"}


@pytest.mark.skipif(nvml_loads(), reason="NVML loads here: the variable is kept on purpose")
def test_importing_the_engine_after_lightning_leaves_no_nvml_check_without_nvml() -> None:
    code = (
        "import os, lightning; assert os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK') == '1';"
        "import fedlightning.federated.module; print(os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK'))"
    )
    env = {k: v for k, v in os.environ.items() if k != NVML_CHECK}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "None"
