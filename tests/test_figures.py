"""Publication figures outside the sweep plot: a run's curve, its title, the label histogram of a split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image

from fedlightning.callbacks.bits_accuracy import curve_title
from fedlightning.datamodules.partition import dirichlet_partition
from fedlightning.plotting import COLUMN_WIDTH, PNG_DPI, plot_curves, plot_label_distribution


def test_run_curve_title_names_the_compressor_and_the_partition() -> None:
    title = curve_title(method="fedavg", data="digits", partition="dirichlet", compressor="qsgd")
    assert "qsgd" in title and "dirichlet" in title and "fedavg on digits" in title


def test_curves_of_one_sweep_axis_are_labelled_by_value_under_a_titled_legend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: drawn.append(self))
    curves = {"compressor=none": [(1e6, 0.8), (2e6, 0.9)], "compressor=qsgd": [(3e4, 0.7), (6e4, 0.88)]}
    plot_curves(curves, tmp_path / "c.png", title="FedAvg on digits")
    (fig,) = drawn
    (legend,) = fig.legends
    assert legend.get_title().get_text() == "compressor"
    assert [t.get_text() for t in legend.get_texts()] == ["none", "qsgd"]
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Uplink bits", "Validation accuracy")


def test_run_curve_is_a_column_wide_png_and_a_pdf(tmp_path: Path) -> None:
    png = plot_curves({"run": [(1e6, 0.8), (2e6, 0.9)]}, tmp_path / "c.png", pdf=True)
    width, _ = Image.open(png).size
    assert width <= (COLUMN_WIDTH + 0.2) * PNG_DPI
    assert png.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"


def test_label_distribution_labels_every_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: drawn.append(self))
    labels = np.repeat(np.arange(10), 40)
    parts = dirichlet_partition(labels, 20, alpha=0.5, seed=0)
    plot_label_distribution(labels, parts, tmp_path / "labels.png")
    (fig,) = drawn
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(k) for k in range(20)]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Client", "Samples on the client")


def test_label_distribution_is_written(tmp_path: Path) -> None:
    labels = np.repeat(np.arange(3), 10)
    path = plot_label_distribution(labels, [np.arange(15), np.arange(15, 30)], tmp_path / "labels.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
