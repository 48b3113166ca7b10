"""Golub et al. (1999) ALL/AML leukemia expression data, preprocessed as Dudoit et al. (2002).

Data: Golub et al., "Molecular classification of cancer: class discovery and class
prediction by gene expression monitoring", Science 286:531–537 (1999); Broad Institute
public files ``data_set_ALL_AML_train.csv`` (38 samples), ``data_set_ALL_AML_independent.csv``
(34 samples) and the labels ``actual.csv`` (47 ALL, 25 AML), 7,129 Affymetrix Hu6800 probes.

Preprocessing: Dudoit, Fridlyand and Speed, "Comparison of discrimination methods for the
classification of tumors using gene expression data", JASA 97(457):77–87 (2002), as coded in
Bioconductor ``multtest/inst/doc/golub.R`` but on all 72 samples:

1. floor at 100 and ceiling at 16,000;
2. keep a gene iff max/min > 5 and max − min > 500 across the 72 samples (strict ``>``);
3. log10;
4. standardise each *sample* (array) to mean 0 and variance 1 across genes (R's ``scale``,
   i.e. the n − 1 standard deviation).

This gives exactly 72 × 3,571 (:func:`preprocess_golub`). Because the filter and the
per-sample standardisation do not look at labels and do not pool information across samples
in a label-dependent way, they are applied once to all 72 arrays, as in the paper.
The optional per-gene z-scoring (``feature_standardise``) is an extra step fit on the
training split only.

Each seed draws a fresh stratified train/test split (``test_fraction``, default 30%) and the
training samples are then spread over the clients by the configured partitioner (IID or
Dirichlet label skew).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlightning.datamodules.base import DataUnavailableError, FederatedDataModule

__all__ = ["GOLUB_FILES", "GolubData", "GolubDataModule", "preprocess_golub", "read_golub"]

GOLUB_FILES = ("data_set_ALL_AML_train.csv", "data_set_ALL_AML_independent.csv", "actual.csv")
#: Class index of each label (ALL is the majority class 0).
CLASSES = ("ALL", "AML")
FLOOR, CEILING = 100.0, 16_000.0
MIN_FOLD, MIN_RANGE = 5.0, 500.0


@dataclass(frozen=True)
class GolubData:
    """Raw or preprocessed Golub data.

    Attributes:
        x: ``(samples, genes)`` expression matrix, samples ordered by patient number.
        y: ``(samples,)`` labels, 0 = ALL, 1 = AML.
        patients: patient numbers (1..72) of the rows.
        probe_ids: Affymetrix probe id ("Gene Accession Number") of each column.
        gene_names: the "Gene Description" of each column.
    """

    x: np.ndarray
    y: np.ndarray
    patients: np.ndarray
    probe_ids: tuple[str, ...]
    gene_names: tuple[str, ...]


def _read_expression(path: Path) -> tuple[list[int], list[str], list[str], np.ndarray]:
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    header = rows[0]
    if header[:2] != ["Gene Description", "Gene Accession Number"]:
        raise DataUnavailableError(
            f"{path} does not start with the Golub header 'Gene Description,Gene Accession Number'."
        )
    value_cols = [i for i in range(2, len(header)) if header[i].strip().lower() != "call"]
    try:
        patients = [int(header[i]) for i in value_cols]
    except ValueError:
        bad = next(i for i in value_cols if not header[i].strip().isdigit())
        raise DataUnavailableError(
            f"{path} column {bad + 1} of the header is {header[bad]!r}, not a patient number; "
            "use the Broad Institute CSV unchanged."
        ) from None
    names: list[str] = []
    probes: list[str] = []
    table: list[list[float]] = []
    for line, r in enumerate(rows[1:], start=2):  # line numbers as an editor counts them (the header is 1)
        if not r:
            continue
        cells: list[float] = []
        for i in value_cols:
            cell = r[i] if i < len(r) else ""
            try:
                value = float(cell)
            except ValueError:
                value = float("nan")
            if not np.isfinite(value):
                raise DataUnavailableError(
                    f"{path} row {line} (probe {r[1] if len(r) > 1 else '?'}), column {i + 1} "
                    f"(patient {header[i]}) holds {cell!r}, not a finite number; "
                    "restore the value from the Broad Institute CSV."
                )
            cells.append(value)
        names.append(r[0])
        probes.append(r[1])
        table.append(cells)
    values = np.array(table, dtype=np.float64).reshape(len(table), len(value_cols))
    return patients, names, probes, values  # values: genes x samples


def _read_labels(path: Path) -> dict[int, str]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or not {"patient", "cancer"} <= set(reader.fieldnames):
            raise DataUnavailableError(f"{path} does not start with the header 'patient,cancer'.")
        labels: dict[int, str] = {}
        for line, r in enumerate(reader, start=2):
            patient, cancer = (r["patient"] or "").strip(), (r["cancer"] or "").strip()
            if not patient.isdigit():
                raise DataUnavailableError(
                    f"{path} row {line}, column patient holds {patient!r}, not a patient number; "
                    "restore it from the Broad Institute CSV."
                )
            if cancer not in CLASSES:
                raise DataUnavailableError(
                    f"{path} row {line}, column cancer holds {cancer!r}, not one of {' or '.join(CLASSES)}; "
                    "restore it from the Broad Institute CSV."
                )
            labels[int(patient)] = cancer
    return labels


def read_golub(root: str | Path) -> GolubData:
    """Read the three original CSV files under ``root`` (no preprocessing).

    Args:
        root: Folder holding :data:`GOLUB_FILES`.

    Returns:
        ``GolubData`` with ``x`` of shape ``(72, 7129)``, rows in patient order.

    Raises:
        DataUnavailableError: If a file is missing or malformed.
    """
    root = Path(root)
    missing = [f for f in GOLUB_FILES if not (root / f).is_file()]
    if missing:
        raise DataUnavailableError(
            f"Golub files {', '.join(missing)} are missing under {root}; set data.root to the folder holding "
            "the Broad Institute CSVs (e.g. the Kaggle copy 'gene-expression' of Golub et al. 1999)."
        )
    p_tr, names, probes, v_tr = _read_expression(root / GOLUB_FILES[0])
    p_te, _, probes_te, v_te = _read_expression(root / GOLUB_FILES[1])
    if probes != probes_te:
        raise DataUnavailableError(
            f"The probe ids of {GOLUB_FILES[0]} and {GOLUB_FILES[1]} differ; the files do not match."
        )
    patients = np.array(p_tr + p_te)
    values = np.concatenate([v_tr, v_te], axis=1).T  # samples x genes
    labels = _read_labels(root / GOLUB_FILES[2])
    order = np.argsort(patients, kind="stable")
    patients = patients[order]
    try:
        y = np.array([CLASSES.index(labels[int(p)]) for p in patients], dtype=np.int64)
    except (KeyError, ValueError) as exc:
        raise DataUnavailableError(f"{GOLUB_FILES[2]} lacks an ALL/AML label for a patient ({exc}).") from None
    return GolubData(x=values[order], y=y, patients=patients, probe_ids=tuple(probes), gene_names=tuple(names))


def preprocess_golub(data: GolubData) -> GolubData:
    """Dudoit–Fridlyand–Speed preprocessing: threshold, filter, log10, standardise each sample.

    >>> raw = GolubData(x=np.array([[50.0, 200.0, 20000.0], [600.0, 210.0, 100.0]]), y=np.array([0, 1]),
    ...                 patients=np.array([1, 2]), probe_ids=("a", "b", "c"), gene_names=("A", "B", "C"))
    >>> out = preprocess_golub(raw)
    >>> out.probe_ids  # b fails max/min > 5; a: 600/100 = 6 > 5 but 600 - 100 = 500 is not > 500
    ('c',)
    """
    x = np.clip(data.x, FLOOR, CEILING)
    hi, lo = x.max(axis=0), x.min(axis=0)
    keep = (hi / lo > MIN_FOLD) & (hi - lo > MIN_RANGE)
    x = np.log10(x[:, keep])
    if x.shape[1] > 1:
        x = (x - x.mean(axis=1, keepdims=True)) / x.std(axis=1, ddof=1, keepdims=True)
    idx = np.flatnonzero(keep)
    return GolubData(
        x=x,
        y=data.y,
        patients=data.patients,
        probe_ids=tuple(data.probe_ids[i] for i in idx),
        gene_names=tuple(data.gene_names[i] for i in idx),
    )


class GolubDataModule(FederatedDataModule):
    """Golub leukemia (72 × 3,571 after preprocessing), binary ALL (0) vs AML (1).

    Takes the keyword arguments of :class:`FederatedDataModule` plus:

    Args:
        test_fraction: share of the 72 samples held out as the test set by a stratified split
            drawn from ``seed`` (``data.test_fraction``; 0.3 gives 50 train / 22 test).
        feature_standardise: also z-score each gene with the training split's mean and
            standard deviation (an extra step, not in Dudoit et al.).

    ``root`` is the folder holding :data:`GOLUB_FILES`, or a folder with a ``golub/``
    subfolder that does. ``probe_ids`` and ``gene_names`` name the feature columns (input
    index ``j`` is gene ``j``).
    """

    name = "golub"
    num_classes = 2
    input_shape: tuple[int, ...] = (3571,)

    def __init__(self, *, test_fraction: float = 0.3, feature_standardise: bool = False, **kwargs: object) -> None:
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(
                f"data.test_fraction must be in (0, 1) (got {test_fraction}); use e.g. data.test_fraction=0.3"
            )
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.test_fraction = float(test_fraction)
        self.feature_standardise = bool(feature_standardise)
        self.probe_ids: tuple[str, ...] = ()
        self.gene_names: tuple[str, ...] = ()
        self.train_patients: np.ndarray = np.empty(0, np.int64)
        self.test_patients: np.ndarray = np.empty(0, np.int64)

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        from sklearn.model_selection import train_test_split  # only when Golub is used (see digits.py)

        folder = self.root / "golub" if (self.root / "golub").is_dir() else self.root
        data = preprocess_golub(read_golub(folder))
        self.probe_ids, self.gene_names = data.probe_ids, data.gene_names
        self.input_shape = (data.x.shape[1],)
        idx_tr, idx_te = train_test_split(
            np.arange(len(data.y)), test_size=self.test_fraction, stratify=data.y, random_state=self.seed
        )
        idx_tr, idx_te = np.sort(idx_tr), np.sort(idx_te)
        self._dataset_rows = (len(data.y), idx_tr)  # saved partitions index the 72 patients
        self.train_patients, self.test_patients = data.patients[idx_tr], data.patients[idx_te]
        x_tr, x_te = data.x[idx_tr], data.x[idx_te]
        if self.feature_standardise:
            mu, sd = x_tr.mean(axis=0), x_tr.std(axis=0)
            sd[sd == 0] = 1.0
            x_tr, x_te = (x_tr - mu) / sd, (x_te - mu) / sd
        as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
        return (as_t(x_tr), torch.from_numpy(data.y[idx_tr])), (as_t(x_te), torch.from_numpy(data.y[idx_te]))
