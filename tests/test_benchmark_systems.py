"""The benchmark suite's ``--systems`` filter (benchmarks/perf/peers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, whose benchmarks/ is not installed

from benchmarks.perf import peers


def names(wanted: str) -> list[str]:
    return [s.name for s in peers.select_systems(peers.SYSTEMS, wanted)]


def test_semicolons_select_a_name_that_contains_a_comma() -> None:
    # Without ';' the value splits at its comma into "fedlightning" and "1 process".
    assert names("fedlightning, 1 process") == [
        "fedlightning, 1 process",
        "fedlightning, 2 processes",
        "plain PyTorch loop, 1 process",
        "pfl-research 0.6, 1 process",
    ]
    assert names("fedlightning, 1 process;") == ["fedlightning, 1 process"]
    assert names("fedlightning, 1 process; plain") == ["fedlightning, 1 process", "plain PyTorch loop, 1 process"]


def test_commas_separate_when_there_is_no_semicolon_and_empty_keeps_every_system() -> None:
    assert names("plain,Flower") == ["plain PyTorch loop, 1 process", "Flower 1.42 simulation, num_cpus=1"]
    assert names("") == names(" ; ") == [s.name for s in peers.SYSTEMS]
    assert names("nothing-like-this") == []
