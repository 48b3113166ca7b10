"""``fedlightning --help``: every config group with every one of its choices, one line each."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import CONFIG_DIR, REPO_ROOT

GROUPS = (
    "method",
    "model",
    "data",
    "partition",
    "sampler",
    "compressor",
    "downlink",
    "failures",
    "divergence",
    "logger",
    "trainer",
    "experiment",
)


def test_help_lists_every_group_with_every_choice() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    result = subprocess.run(
        [sys.executable, "-m", "fedlightning.cli", "--help"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("fedlightning: "), lines[:3]
    assert "powered by Hydra" not in lines[0]
    header = lines[: lines.index("== Config ==")]  # the composed config below lists the nodes again
    groups = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name != "hydra")
    assert set(GROUPS) <= set(groups)
    for group in groups:  # read from the configs folder: a new group or config is covered
        listed = [line for line in header if line.startswith(f"{group}: ")]
        assert len(listed) == 1, (group, listed)
        choices = set(listed[0].removeprefix(f"{group}: ").split(", "))
        assert choices == {p.stem for p in (CONFIG_DIR / group).glob("*.yaml")}, group
    assert "== Config ==" in result.stdout and "--hydra-help" in result.stdout  # then Hydra's own help
