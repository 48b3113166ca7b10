"""The partition file itself (fedlightning/datamodules/partition_files.py), on hand-made splits of ten samples.

tests/test_datamodules.py and tests/test_run_folder_safety.py reach these functions through a
data module; here each is called directly and every expected array and sentence is written out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedlightning.datamodules.partition_files import (
    PARTITION_FORMAT_VERSION,
    PartitionRecord,
    check_v1_partition,
    load_partition_file,
    read_partition_file,
    refuse_mismatch,
    rows_of_saved_split,
    sorted_clients,
    write_partition_file,
)

RESAVE = "point it at a partition.json (or .npz) written by a run, or re-save the partition"
MISMATCH = "use the same data settings or unset data.partition_file to partition again."

# Ten samples: 4, 6 and 8 held out, the other seven cut into three clients (given unsorted).
RECORD = PartitionRecord(
    dataset="toy",
    num_dataset_samples=10,
    num_train_samples=7,
    num_clients=3,
    partition="hand",
    seed=3,
    val_fraction=0.3,
    max_train_samples=None,
    validation=np.array([4, 6, 8]),
    clients=sorted_clients(np.array([7, 2, 9, 0, 5, 3, 1]), np.array([0, 2, 5, 7])),
)
CLIENTS = [[2, 7], [0, 5, 9], [1, 3]]
META = {
    "format": "fedlightning.partition",
    "version": 2,
    "dataset": "toy",
    "index": "dataset",
    "num_dataset_samples": 10,
    "num_train_samples": 7,
    "num_clients": 3,
    "partition": "hand",
    "seed": 3,
    "val_fraction": 0.3,
    "max_train_samples": None,
}
RUN = {"dataset": "toy", "num_clients": 3, "val_fraction": 0.3, "max_train_samples": None}


def _read(path: Path, **run: Any) -> dict[str, Any]:
    return read_partition_file(path, **{**RUN, **run})


def _message(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ValueError) as info:
        call(*args, **kwargs)
    return str(info.value)


def test_the_record_sorts_each_client_and_is_the_documented_json_object() -> None:
    assert RECORD.clients.indices.tolist() == [2, 7, 0, 5, 9, 1, 3]
    assert RECORD.clients.offsets.tolist() == [0, 2, 5, 7]
    assert PARTITION_FORMAT_VERSION == 2
    assert RECORD.meta() == META and list(RECORD.meta()) == list(META)  # the keys in the order they are written
    assert RECORD.to_json() == {**META, "validation": [4, 6, 8], "clients": CLIENTS}


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_a_written_file_reads_back_as_the_record(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"partition{suffix}"
    write_partition_file(path, record=RECORD)
    saved = _read(path)
    assert [c.dtype for c in saved["clients"]] == [np.dtype(np.int64)] * 3
    assert [c.tolist() for c in saved["clients"]] == CLIENTS
    assert saved["validation"].dtype == np.int64 and saved["validation"].tolist() == [4, 6, 8]
    assert {k: v for k, v in saved.items() if k not in ("clients", "validation", "path")} == META
    assert saved["path"] == path
    if suffix == ".json":
        assert json.loads(path.read_text()) == RECORD.to_json()
    else:
        with np.load(path, allow_pickle=False) as z:
            assert sorted(z.files) == ["indices", "meta", "offsets", "validation"]
            assert z["indices"].tolist() == [2, 7, 0, 5, 9, 1, 3] and z["offsets"].tolist() == [0, 2, 5, 7]
            assert json.loads(str(z["meta"])) == META


def test_the_rows_of_a_saved_split_are_where_the_run_loaded_its_samples(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    write_partition_file(path, record=RECORD)
    origin = np.array([4, 0, 9, 2, 7, 5, 3, 8, 6, 1])  # the data set's index of each loaded row
    val, train = rows_of_saved_split(
        _read(path), origin=origin, num_dataset=10, seed=3, dataset="toy", data_depends_on_seed=True
    )
    assert val.tolist() == [0, 8, 7]  # samples 4, 6, 8
    assert train.tolist() == [3, 4, 1, 5, 2, 9, 6]  # samples 2, 7 | 0, 5, 9 | 1, 3


def test_a_version_1_file_is_read_and_checked_against_all_its_settings(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    old = {"dataset": "toy", "num_train_samples": 7, "num_clients": 3, "seed": 3, "val_fraction": 0.3}
    path.write_text(json.dumps({**old, "clients": [[0, 6], [1, 2, 5], [3, 4]]}))
    saved = _read(path, max_train_samples=500)  # version 1 records no max_train_samples: not compared
    assert saved["version"] == 1 and "validation" not in saved
    parts = check_v1_partition(saved, num_train_samples=7, seed=3, val_fraction=0.3)
    assert [p.tolist() for p in parts] == [[0, 6], [1, 2, 5], [3, 4]]
    assert _message(check_v1_partition, saved, num_train_samples=8, seed=4, val_fraction=0.3) == (
        f"data.partition_file={path} does not match this data set: num_train_samples=7 (this run: 8), "
        f"seed=3 (this run: 4); {MISMATCH}"
    )


@pytest.mark.parametrize(
    ("version", "sentence"),
    [
        (
            3,
            "has format version 3, newer than the versions 1 to 2 this fedlightning reads; upgrade fedlightning "
            "or re-save the partition.",
        ),
        (0, "has version 0, not a format version (1 to 2); re-save the partition."),
        (True, "has version True, not a format version (1 to 2); re-save the partition."),
        (2.0, "has version 2.0, not a format version (1 to 2); re-save the partition."),
    ],
)
def test_a_version_this_code_does_not_read_is_refused(tmp_path: Path, version: object, sentence: str) -> None:
    path = tmp_path / "partition.json"
    path.write_text(json.dumps({**RECORD.to_json(), "version": version}))
    assert _message(_read, path) == f"data.partition_file={path} {sentence}"


def test_another_client_count_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    write_partition_file(path, record=RECORD)
    assert _message(_read, path, num_clients=4) == (
        f"data.partition_file={path} does not match this data set: num_clients=3 (this run: 4); {MISMATCH}"
    )
    path.write_text(json.dumps({**RECORD.to_json(), "clients": CLIENTS[:2]}))  # the meta still says 3
    assert _message(_read, path) == (
        f"data.partition_file={path} does not match this data set: client count differs; {MISMATCH}"
    )


def test_mismatched_settings_are_refused_naming_each(tmp_path: Path) -> None:
    path = tmp_path / "partition.npz"
    write_partition_file(path, record=RECORD)
    assert _message(_read, path, dataset="digits", val_fraction=0.1, max_train_samples=600) == (
        f"data.partition_file={path} does not match this data set: dataset=toy (this run: digits), "
        f"val_fraction=0.3 (this run: 0.1), max_train_samples=None (this run: 600); {MISMATCH}"
    )
    assert _message(refuse_mismatch, path, meta=META, expected={"num_dataset_samples": 11}) == (
        f"data.partition_file={path} does not match this data set: num_dataset_samples=10 (this run: 11); {MISMATCH}"
    )
    refuse_mismatch(path, meta=META, expected={"num_dataset_samples": 10, "seed": 3})  # equal: nothing to refuse


@pytest.mark.parametrize(
    ("clients", "validation", "sentence"),
    [
        ([[2, 7], [-1]], [4], f"holds index -1 in client 1, outside [0, 2^63); {RESAVE}."),
        ([[2, 7], [1.0]], [4], f"lists 1.0 in client 1, which is not a sample index (an integer); {RESAVE}."),
        ([[True]], [4], f"lists True in client 0, which is not a sample index (an integer); {RESAVE}."),
        ([[2, 7]], 4, f"lists 4 in validation, which is not a sample index (an integer); {RESAVE}."),
        ([[2, 7]], [2**63], f"holds index {2**63} in validation, outside [0, 2^63); {RESAVE}."),
    ],
)
def test_a_json_index_that_is_not_a_sample_index_is_refused(
    tmp_path: Path, clients: object, validation: object, sentence: str
) -> None:
    path = tmp_path / "partition.json"
    path.write_text(json.dumps({"clients": clients, "validation": validation}))
    assert _message(load_partition_file, path) == f"data.partition_file={path} {sentence}"


@pytest.mark.parametrize(
    ("arrays", "sentence"),
    [
        ({"indices": np.array([0.0, 1.0])}, "holds indices as a 1-d float64 array, not sample indices."),
        ({"indices": np.zeros((2, 1), np.int64)}, "holds indices as a 2-d int64 array, not sample indices."),
        (
            {"offsets": np.array([0, 5, 3, 7])},
            f"has offsets that do not cut its 7 indices into clients (from 0, non-decreasing, to 7); {RESAVE}.",
        ),
        (
            {"offsets": np.array([0, 2, 6])},
            f"has offsets that do not cut its 7 indices into clients (from 0, non-decreasing, to 7); {RESAVE}.",
        ),
        ({"meta": np.array("[1, 2]")}, f"has meta that is not a JSON object; {RESAVE}."),
    ],
)
def test_a_damaged_npz_array_is_refused(tmp_path: Path, arrays: dict[str, np.ndarray], sentence: str) -> None:
    path = tmp_path / "partition.npz"
    good = {"indices": RECORD.clients.indices, "offsets": RECORD.clients.offsets, "meta": np.array(json.dumps(META))}
    np.savez(path, **{**good, **arrays})
    assert _message(load_partition_file, path) == f"data.partition_file={path} {sentence}"


def test_an_empty_client_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    path.write_text(json.dumps({**RECORD.to_json(), "clients": [[2, 7], [], []]}))
    assert _message(_read, path) == (
        f"data.partition_file={path} gives client 1 no samples (2 clients are empty); every client needs at least "
        "one sample: re-save the partition or give each client a sample."
    )
    with pytest.raises(FileNotFoundError) as info:
        _read(tmp_path / "none.json")
    assert str(info.value) == (
        f"data.partition_file={tmp_path / 'none.json'} does not exist; unset it or point it at a saved file."
    )


@pytest.mark.parametrize(
    ("clients", "validation", "origin", "sentence"),
    [
        ([[2, 7], [0, 5, 10], [1, 3]], [4, 6, 8], range(10), "holds indices outside [0, 10); re-save it."),
        (
            [[2, 7], [0, 5, 9], [1, 4]],
            [4, 6, 8],
            range(10),
            "lists a sample twice (clients or validation); re-save it.",
        ),
        (
            CLIENTS,
            [4, 6, 8],
            [0, 1, 2, 3, 4, 5, 6, 8, 9],
            "uses samples this run does not train on (its test split "
            "or data.max_train_samples subset depends on seed=3; the file's seed was 3); use seed=3.",
        ),
        (
            CLIENTS,
            [4, 6],
            range(10),
            "assigns 9 of the 10 samples this run loads (1 are in no client and not held "
            "out); every sample must be listed exactly once: re-save the partition.",
        ),
    ],
)
def test_a_saved_split_that_does_not_list_each_loaded_sample_once_is_refused(
    tmp_path: Path, clients: list[list[int]], validation: list[int], origin: Any, sentence: str
) -> None:
    path = tmp_path / "partition.json"
    path.write_text(json.dumps({**RECORD.to_json(), "clients": clients, "validation": validation}))
    saved = _read(path)
    message = _message(
        rows_of_saved_split,
        saved,
        origin=np.array(list(origin)),
        num_dataset=10,
        seed=3,
        dataset="toy",
        data_depends_on_seed=False,
    )
    assert message == f"data.partition_file={path} {sentence}"


def test_a_split_of_generated_data_is_refused_under_another_seed(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    write_partition_file(path, record=RECORD)
    kwargs: dict[str, Any] = {"origin": np.arange(10), "num_dataset": 10, "seed": 4, "dataset": "toy"}
    val, _ = rows_of_saved_split(_read(path), data_depends_on_seed=False, **kwargs)  # fixed data: any seed
    assert val.tolist() == [4, 6, 8]
    assert _message(rows_of_saved_split, _read(path), data_depends_on_seed=True, **kwargs) == (
        f"data=toy generates its samples from seed, so data.partition_file={path} (saved with seed=3) names "
        "other samples under seed=4; use seed=3."
    )
    assert _message(rows_of_saved_split, _read(path), data_depends_on_seed=False, **{**kwargs, "num_dataset": 12}) == (
        f"data.partition_file={path} does not match this data set: num_dataset_samples=10 (this run: 12); {MISMATCH}"
    )
