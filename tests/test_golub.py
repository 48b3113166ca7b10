"""Golub data: the Dudoit et al. preprocessing yields 72 × 3,571; splits and partitions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedlightning.datamodules.golub import GolubDataModule, preprocess_golub, read_golub
from fedlightning.datamodules.partition import DirichletPartition, IIDPartition


@pytest.fixture(scope="module")
def golub_root(shared_data_root: Path) -> Path:
    root = shared_data_root / "golub"
    if not root.is_dir():
        pytest.skip(f"no Golub copy under {root}")
    return root


def test_preprocessing_gives_72_by_3571(golub_root: Path) -> None:
    raw = read_golub(golub_root)
    assert raw.x.shape == (72, 7129) and raw.patients.tolist() == list(range(1, 73))
    data = preprocess_golub(raw)
    assert data.x.shape == (72, 3571)
    assert np.bincount(data.y).tolist() == [47, 25]
    np.testing.assert_allclose(data.x.mean(axis=1), 0.0, atol=1e-10)
    np.testing.assert_allclose(data.x.std(axis=1, ddof=1), 1.0, atol=1e-10)
    assert len(data.probe_ids) == len(data.gene_names) == 3571
    assert "M27891_at" in data.probe_ids and "M19507_at" in data.probe_ids  # CST3, MPO
    assert data.gene_names[data.probe_ids.index("M27891_at")].startswith("CST3 Cystatin C")
    assert data.gene_names[data.probe_ids.index("M19507_at")].startswith("MPO Myeloperoxidase")


def test_filter_is_strict() -> None:
    from fedlightning.datamodules.golub import GolubData

    # gene a: max/min = 6 but max-min = 500 exactly (dropped); gene b: 5x exactly (dropped)
    raw = GolubData(
        x=np.array([[100.0, 100.0, 100.0], [600.0, 500.0, 5000.0]]),
        y=np.array([0, 1]),
        patients=np.array([1, 2]),
        probe_ids=("a", "b", "c"),
        gene_names=("A", "B", "C"),
    )
    assert preprocess_golub(raw).probe_ids == ("c",)


@pytest.mark.parametrize("partition", [IIDPartition(), DirichletPartition(alpha=0.5)])
def test_datamodule_split_and_partition(golub_root: Path, partition: object) -> None:
    dm = GolubDataModule(root=str(golub_root.parent), num_clients=5, partition=partition, val_fraction=0.0, seed=3)
    dm.setup("fit")
    assert dm.input_shape == (3571,) and dm.num_train_samples == 50
    _, y_te = dm.test_dataloader().dataset.tensors
    assert len(y_te) == 22 and int(y_te.sum()) in (7, 8)  # stratified: 25 AML * 0.3
    assert sorted(set(dm.train_patients) | set(dm.test_patients)) == list(range(1, 73))
    assert sum(dm.client_sizes) == 50 and min(dm.client_sizes) > 0
    other = GolubDataModule(root=str(golub_root), num_clients=5, partition=partition, val_fraction=0.0, seed=4)
    other.setup("fit")
    assert set(other.test_patients) != set(dm.test_patients)  # a fresh split per seed


def test_feature_standardise_uses_train_split(golub_root: Path) -> None:
    dm = GolubDataModule(root=str(golub_root), num_clients=2, val_fraction=0.0, feature_standardise=True)
    dm.setup("fit")
    x, _ = dm.client_tensors(0)
    x_all = np.concatenate([dm.client_tensors(k)[0].numpy() for k in range(2)])
    np.testing.assert_allclose(x_all.mean(axis=0), 0.0, atol=1e-4)
    assert x.shape[1] == 3571


def test_missing_files_message(tmp_path: Path) -> None:
    from fedlightning.datamodules.base import DataUnavailableError

    with pytest.raises(DataUnavailableError, match=r"set data\.root"):
        read_golub(tmp_path)


def _golub_copy_with(golub_root: Path, dest: Path, file: str, line: int, column: int, cell: str) -> Path:
    """Copy the three CSVs into ``dest`` with one cell (1-based ``line`` and ``column``) of ``file`` replaced."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("data_set_ALL_AML_train.csv", "data_set_ALL_AML_independent.csv", "actual.csv"):
        shutil.copyfile(golub_root / name, dest / name)
    lines = (dest / file).read_text().splitlines(keepends=True)
    cells = lines[line - 1].rstrip("\r\n").split(",")
    cells[column - 1] = cell
    lines[line - 1] = ",".join(cells) + "\n"
    (dest / file).write_text("".join(lines))
    return dest


@pytest.mark.parametrize("cell", ["NaN", "", "inf", "-Infinity", "12x"])
def test_a_non_finite_expression_cell_names_the_file_row_and_column(
    golub_root: Path, tmp_path: Path, cell: str
) -> None:
    from fedlightning.datamodules.base import DataUnavailableError

    # Column 5 of the train file is patient 2's value; row 10 is the ninth probe.
    root = _golub_copy_with(golub_root, tmp_path / "golub", "data_set_ALL_AML_train.csv", 10, 5, cell)
    with pytest.raises(DataUnavailableError) as info:
        read_golub(root)
    text = str(info.value)
    assert "\n" not in text
    assert str(root / "data_set_ALL_AML_train.csv") in text and "row 10" in text and "column 5 (patient 2)" in text
    assert "not a finite number" in text


@pytest.mark.parametrize("cell", ["nan", "", "ALLL"])
def test_a_bad_label_names_the_file_row_and_column(golub_root: Path, tmp_path: Path, cell: str) -> None:
    from fedlightning.datamodules.base import DataUnavailableError

    root = _golub_copy_with(golub_root, tmp_path / "golub", "actual.csv", 4, 2, cell)
    with pytest.raises(DataUnavailableError) as info:
        read_golub(root)
    assert str(root / "actual.csv") in str(info.value) and "row 4, column cancer" in str(info.value)


def test_a_nan_cell_stops_the_run_before_training(golub_root: Path, tmp_path: Path) -> None:
    from fedlightning.errors import FedLightningError
    from fedlightning.run import run

    from .conftest import compose_config

    root = _golub_copy_with(golub_root, tmp_path / "data", "data_set_ALL_AML_independent.csv", 100, 3, "nan")
    cfg = compose_config(["data=golub", f"data.root={root}", "rounds=1"])
    with pytest.raises(FedLightningError, match=r"data_set_ALL_AML_independent\.csv row 100 .*column 3"):
        run(cfg, tmp_path / "out")
    assert not (tmp_path / "out" / "summary.json").exists()
