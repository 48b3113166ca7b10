"""Every command of docs/catalogue.md that needs no data folder runs a round as written.

The page's commands that name ``data.root=DATA`` need a data set on disk and are only composed
(``tests/test_catalogue.py``); the others train on the embedded digits or generated data.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedlightning.run import run
from tests.conftest import compose_config

PAGE = Path(__file__).resolve().parents[1] / "docs" / "catalogue.md"

#: The page's commands that need no data folder, each run for one round as a user would type it.
LOCAL_COMMANDS = sorted(
    {c for c in re.findall(r"`fedlightning ([^`]*)`", PAGE.read_text()) if "DATA" not in c and "RUN/" not in c}
)


def test_most_of_the_page_s_commands_need_no_data_folder() -> None:
    assert len(LOCAL_COMMANDS) >= 60


@pytest.mark.parametrize("command", LOCAL_COMMANDS)
def test_a_command_of_the_page_runs_a_round_as_written(command: str, tmp_path: Path) -> None:
    overrides = [*command.split(), "rounds=1", "eval_every=1"]
    summary = run(compose_config(overrides), tmp_path / "run", overrides=overrides)
    assert summary["rounds"] == 1
