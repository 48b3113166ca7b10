"""The partition file: a saved split of a data set into a validation hold-out and clients.

:meth:`~fedlightning.datamodules.base.FederatedDataModule.save_partition` writes it and
``partition_file=path`` reads it back (docs/datamodules.md, "``partition.json``"). Format
version 2 holds the settings that drew the split, the sorted ``validation`` indices and one
sorted index list per client, every index the data set's own (a sample's position in the
data set as its loader reads it, before any ``max_train_samples`` subset and the hold-out).
A ``.json`` path holds one JSON object; any other path a NumPy ``.npz`` with the arrays
``indices``, ``offsets`` (client ``k`` is ``indices[offsets[k]:offsets[k + 1]]``),
``validation`` and the other keys as a JSON string ``meta``. Version 1 files (no ``version``
key) index the training set left after the hold-out and hold no ``validation``.

Everything here is a function of its arguments and the file: which rows a data module loaded,
its seed and its settings are passed in. A file that cannot be used is refused with a
``ValueError`` of one sentence that starts with ``data.partition_file=<path>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedlightning.datamodules.partition import ClientPartition
from fedlightning.folder_lock import write_text_atomic

__all__ = [
    "PARTITION_FORMAT",
    "PARTITION_FORMAT_VERSION",
    "PartitionRecord",
    "check_v1_partition",
    "load_partition_file",
    "read_partition_file",
    "refuse_mismatch",
    "rows_of_saved_split",
    "sorted_clients",
    "write_partition_file",
]

#: Version of the file :func:`write_partition_file` writes; versions 1 to this one are read.
PARTITION_FORMAT_VERSION = 2
PARTITION_FORMAT = "fedlightning.partition"

_RESAVE = "point it at a partition.json (or .npz) written by a run, or re-save the partition"
INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True, eq=False)
class PartitionRecord:
    """What a version-2 partition file holds: the settings that drew the split, the hold-out and the clients.

    ``validation`` and each client's indices are sorted data-set indices (see :func:`sorted_clients`).
    """

    dataset: str
    num_dataset_samples: int
    num_train_samples: int
    num_clients: int
    partition: str
    seed: int
    val_fraction: float
    max_train_samples: int | None
    validation: np.ndarray
    clients: ClientPartition

    def meta(self) -> dict[str, object]:
        """The settings, with ``format``, ``version`` and ``index``: every key but the index lists."""
        return {
            "format": PARTITION_FORMAT,
            "version": PARTITION_FORMAT_VERSION,
            "dataset": self.dataset,
            "index": "dataset",
            "num_dataset_samples": self.num_dataset_samples,
            "num_train_samples": self.num_train_samples,
            "num_clients": self.num_clients,
            "partition": self.partition,
            "seed": self.seed,
            "val_fraction": self.val_fraction,
            "max_train_samples": self.max_train_samples,
        }

    def to_json(self) -> dict[str, Any]:
        """The JSON object of a ``.json`` file: :meth:`meta`, ``validation`` and ``clients`` as lists."""
        flat, offsets = self.clients.indices.tolist(), self.clients.offsets.tolist()
        clients = [flat[offsets[k] : offsets[k + 1]] for k in range(len(self.clients))]
        return {**self.meta(), "validation": self.validation.tolist(), "clients": clients}


def sorted_clients(indices: np.ndarray, offsets: np.ndarray) -> ClientPartition:
    """The clients cut from ``indices`` at ``offsets``, each client's indices sorted, as a file lists them.

    Example:
        >>> sorted_clients(np.array([5, 1, 9, 0, 4]), np.array([0, 3, 5])).indices.tolist()
        [1, 5, 9, 0, 4]
    """
    owner = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    return ClientPartition(indices=indices[np.lexsort((indices, owner))], offsets=offsets)  # one vectorised sort


def write_partition_file(path: Path, *, record: PartitionRecord) -> None:
    """Write ``record`` to ``path``: JSON text for a ``.json`` suffix (atomically), else a compressed ``.npz``."""
    if path.suffix == ".json":
        write_text_atomic(path, json.dumps(record.to_json()))
        return
    np.savez_compressed(
        path,
        indices=record.clients.indices,
        offsets=record.clients.offsets,
        validation=record.validation,
        meta=np.array(json.dumps(record.meta())),
    )


def load_partition_file(path: Path) -> dict[str, Any]:
    """A saved partition's meta with ``clients`` (and ``validation``) as int64 index arrays.

    ``.json`` as :func:`write_partition_file` writes it, else ``.npz`` (read without pickles).
    Anything else (not JSON or ``.npz``, a torch ``.pt``, an index that is not a non-negative
    integer below 2^63) is refused with one sentence naming the file.
    """
    where = f"data.partition_file={path}"
    if path.suffix == ".json":
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ValueError(f"{where} is not UTF-8 JSON text; {_RESAVE}.") from None
        except ValueError as exc:
            raise ValueError(f"{where} is not valid JSON ({exc}); {_RESAVE}.") from None
        except OSError as exc:
            raise ValueError(f"{where} cannot be read ({exc.strerror or type(exc).__name__}); {_RESAVE}.") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("clients"), list):
            raise ValueError(f"{where} is not a partition file (no 'clients' list); {_RESAVE}.")
        raw["clients"] = [_index_array(c, where, f"client {k}") for k, c in enumerate(raw["clients"])]
        if "validation" in raw:
            raw["validation"] = _index_array(raw["validation"], where, "validation")
        return raw
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises many types for a file that is not an array archive
        raise ValueError(
            f"{where} is neither a .json partition nor a .npz archive numpy can read ({type(exc).__name__}: "
            f"{str(exc)[:80]}); {_RESAVE}."
        ) from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{where} is a single .npy array, not a partition archive (.npz); {_RESAVE}.")
    with loaded as z:
        missing = [key for key in ("meta", "indices", "offsets") if key not in z.files]
        if missing:
            raise ValueError(
                f"{where} has no '{missing[0]}' array (a torch .pt or another archive, not a saved partition); "
                f"{_RESAVE}."
            )
        try:
            raw = json.loads(str(z["meta"]))
            indices = _index_array(z["indices"], where, "indices")
            offsets = _index_array(z["offsets"], where, "offsets")
            validation = _index_array(z["validation"], where, "validation") if "validation" in z.files else None
        except ValueError as exc:
            text = str(exc)
            sentence = text if text.startswith(where) else f"{where} holds damaged arrays ({text}); {_RESAVE}."
            raise ValueError(sentence) from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where} has meta that is not a JSON object; {_RESAVE}.")
    ok = offsets.size >= 1 and offsets[0] == 0 and offsets[-1] == indices.size and (np.diff(offsets) >= 0).all()
    if not ok:
        raise ValueError(
            f"{where} has offsets that do not cut its {indices.size} indices into clients (from 0, "
            f"non-decreasing, to {indices.size}); {_RESAVE}."
        )
    raw["clients"] = np.split(indices, offsets[1:-1])
    if validation is not None:
        raw["validation"] = validation
    return raw


def _index_array(value: Any, where: str, what: str) -> np.ndarray:
    """``value`` as an int64 array of sample indices; anything but integers in [0, 2^63) is one sentence."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "iu":
            raise ValueError(f"{where} holds {what} as a {value.ndim}-d {value.dtype} array, not sample indices.")
        values: list[int] = [int(value.min()), int(value.max())] if value.size else []
    else:
        items = value if isinstance(value, list) else [value]
        bad = [v for v in items if not isinstance(v, int) or isinstance(v, bool)]
        if bad or not isinstance(value, list):
            shown = bad[0] if bad else value
            raise ValueError(f"{where} lists {shown!r} in {what}, which is not a sample index (an integer); {_RESAVE}.")
        values = items
    if values and (min(values) < 0 or max(values) > INT64_MAX):
        bad_index = min(values) if min(values) < 0 else max(values)
        raise ValueError(f"{where} holds index {bad_index} in {what}, outside [0, 2^63); {_RESAVE}.")
    return np.asarray(value, dtype=np.int64)


def read_partition_file(
    path: Path, *, dataset: str, num_clients: int, val_fraction: float, max_train_samples: int | None
) -> dict[str, Any]:
    """A saved partition checked against a run's settings: its meta, ``version``, ``clients``, ``validation``.

    As :func:`load_partition_file` gives it, with ``version`` (1 when the file has none) and
    ``path`` added. Refused when the file is missing, its version is not one of 1 to
    :data:`PARTITION_FORMAT_VERSION`, its data set or client count differs (version 2: also its
    ``val_fraction`` or ``max_train_samples``), or a client has no sample.
    """
    if not path.is_file():
        raise FileNotFoundError(f"data.partition_file={path} does not exist; unset it or point it at a saved file.")
    raw = load_partition_file(path)
    version = raw.setdefault("version", 1)  # version 1 files carry no version
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(
            f"data.partition_file={path} has version {version!r}, not a format version (1 to "
            f"{PARTITION_FORMAT_VERSION}); re-save the partition."
        )
    if version > PARTITION_FORMAT_VERSION:
        raise ValueError(
            f"data.partition_file={path} has format version {version}, newer than the versions 1 to "
            f"{PARTITION_FORMAT_VERSION} this fedlightning reads; upgrade fedlightning or re-save the partition."
        )
    expected: dict[str, Any] = {"dataset": dataset, "num_clients": num_clients}
    if version >= 2:
        expected |= {"val_fraction": val_fraction, "max_train_samples": max_train_samples}
    refuse_mismatch(path, meta=raw, expected=expected, bad_count=len(raw["clients"]) != num_clients)
    empty = [k for k, c in enumerate(raw["clients"]) if c.size == 0]
    if empty:
        raise ValueError(
            f"data.partition_file={path} gives client {empty[0]} no samples"
            f"{f' ({len(empty)} clients are empty)' if len(empty) > 1 else ''}; every client needs at least "
            "one sample: re-save the partition or give each client a sample."
        )
    raw["path"] = path
    return raw


def refuse_mismatch(path: Path, *, meta: dict[str, Any], expected: dict[str, Any], bad_count: bool = False) -> None:
    """Refuse a file whose ``meta`` differs from ``expected`` at any key (or whose client count differs)."""
    diff = {k: (meta.get(k), v) for k, v in expected.items() if meta.get(k) != v}
    if diff or bad_count:
        got = ", ".join(f"{k}={a} (this run: {b})" for k, (a, b) in diff.items())
        raise ValueError(
            f"data.partition_file={path} does not match this data set: {got or 'client count differs'}; "
            "use the same data settings or unset data.partition_file to partition again."
        )


def rows_of_saved_split(
    saved: dict[str, Any],
    *,
    origin: np.ndarray,
    num_dataset: int,
    seed: int,
    dataset: str,
    data_depends_on_seed: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the loaded data holding a version-2 file's ``validation`` and client samples (client after client).

    ``origin`` is the data set's index of each loaded row and ``num_dataset`` the size of the
    data set's index space. The file must list each loaded row exactly once and nothing else;
    on a data set generated from its seed (``data_depends_on_seed``) it must also carry ``seed``.
    """
    path = saved["path"]
    refuse_mismatch(path, meta=saved, expected={"num_dataset_samples": num_dataset})
    row = np.full(num_dataset, -1, dtype=np.int64)
    row[origin] = np.arange(origin.size)
    val = saved.get("validation", np.empty(0, np.int64))
    train = np.concatenate(saved["clients"]) if saved["clients"] else np.empty(0, np.int64)
    both = np.concatenate([val, train])
    if both.size and (both.min() < 0 or both.max() >= num_dataset):
        raise ValueError(f"data.partition_file={path} holds indices outside [0, {num_dataset}); re-save it.")
    if np.bincount(both, minlength=num_dataset).max(initial=1) > 1:
        raise ValueError(f"data.partition_file={path} lists a sample twice (clients or validation); re-save it.")
    if (row[both] < 0).any():
        raise ValueError(
            f"data.partition_file={path} uses samples this run does not train on (its test split or "
            f"data.max_train_samples subset depends on seed={seed}; the file's seed was "
            f"{saved.get('seed')}); use seed={saved.get('seed')}."
        )
    if both.size != origin.size:
        raise ValueError(
            f"data.partition_file={path} assigns {both.size} of the {origin.size} samples this run loads "
            f"({origin.size - both.size} are in no client and not held out); every sample must be listed "
            "exactly once: re-save the partition."
        )
    if saved.get("seed") != seed and data_depends_on_seed:
        raise ValueError(
            f"data={dataset} generates its samples from seed, so data.partition_file={path} (saved with "
            f"seed={saved.get('seed')}) names other samples under seed={seed}; use seed={saved.get('seed')}."
        )
    return row[val], row[train]


def check_v1_partition(
    saved: dict[str, Any], *, num_train_samples: int, seed: int, val_fraction: float
) -> list[np.ndarray]:
    """A version-1 file's clients, which index the post-hold-out training set: all its settings must match."""
    expected = {"num_train_samples": num_train_samples, "seed": seed, "val_fraction": val_fraction}
    refuse_mismatch(saved["path"], meta=saved, expected=expected)
    return list(saved["clients"])
