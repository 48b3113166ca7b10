"""Every notebook in notebooks/ executes without an error, and the saved copies are executed and small.

Each notebook runs in a temporary copy of notebooks/ (the repository is never written), in a
kernel that imports this checkout's ``fedlightning``. The E-FLoPS notebook reads the Golub CSVs
from ``$FEDLIGHTNING_DATA``: the test points it at the offline data
(``$FEDLIGHTNING_TEST_DATA``, default ``../shared/data``) when that folder exists; without it
the notebook says so and runs nothing, which must not be an error either.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 120
MAX_NOTEBOOK_BYTES = 200_000  # saved outputs stay small: no large images


def _files(folder: Path) -> set[Path]:
    return {p.relative_to(folder) for p in folder.rglob("*") if p.is_file()}


def test_there_are_notebooks() -> None:
    names = {p.stem for p in NOTEBOOKS}
    assert {"zampling_tradeoff", "compressors_equal_bits", "eflops_golub", "reuse_datamodule"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_saved_notebook_is_executed_without_errors_and_small(path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code), f"{path.name} is saved unexecuted"
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"], f"{path.name} is saved with an error"
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES, f"{path.name} is {path.stat().st_size:,} bytes"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    copy = tmp_path / "notebooks"
    shutil.copytree(path.parent, copy)
    before = _files(path.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env["WANDB_MODE"] = "disabled"
    data = Path(os.environ.get("FEDLIGHTNING_TEST_DATA", REPO.parent / "shared" / "data"))
    if data.is_dir():
        env["FEDLIGHTNING_DATA"] = str(data.resolve())
    else:
        env.pop("FEDLIGHTNING_DATA", None)
    book = nbformat.read(copy / path.name, as_version=4)
    client = NotebookClient(
        book, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(copy)}}
    )
    client.execute(env=env)  # a failing cell raises CellExecutionError with its traceback
    assert _files(path.parent) == before, "executing a notebook wrote into the repository"
