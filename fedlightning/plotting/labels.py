"""The per-client label histogram of a federated split (``label_distribution.png`` of a run)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from numpy.typing import ArrayLike

from fedlightning.plotting.style import COLUMN_WIDTH, TEXT_WIDTH, publication_style

#: Up to this many clients every client's bar is labelled with its number.
LABEL_EVERY_CLIENT = 40
#: Resolution of the picture a run saves.
DPI = 200


def plot_label_distribution(
    labels: ArrayLike,
    partition: Sequence[np.ndarray],
    path: str | os.PathLike[str],
    *,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Save a picture of the per-client label histogram of ``partition``.

    Up to 100 clients and 20 classes it draws stacked bars (one bar per client, its height
    the client's size, one colour per class, the legend outside the axes); otherwise a
    heatmap of samples per client and class (white where a client has none of a class).
    Up to :data:`LABEL_EVERY_CLIENT` clients, every client is labelled on the x axis.

    Args:
        labels: Class label of every sample the partition indexes, shape ``(N,)``.
        partition: Per-client index arrays into ``labels``.
        path: Image file to write (``.png``, ``.pdf``, ...); its folder must exist.
        class_names: Names of the sorted distinct labels, for the legend or the y axis.
        title: Figure title; default names the counts of clients, samples and classes.

    Returns:
        ``path`` as a ``Path``.
    """
    from fedlightning.datamodules.partition import partition_summary

    labels = np.asarray(labels).reshape(-1)
    classes, inverse = np.unique(labels, return_inverse=True)
    hist = partition_summary(inverse, list(partition), classes.size)  # K x C
    k, c = hist.shape
    names = [str(n) for n in class_names] if class_names is not None else [str(v) for v in classes]
    if len(names) != c:
        raise ValueError(f"class_names has {len(names)} names for {c} distinct labels.")
    title = title or f"Label distribution: {k} clients, {int(hist.sum()):,} samples, {c} classes"
    stacked = k <= 100 and c <= 20
    width = min(TEXT_WIDTH, max(COLUMN_WIDTH, 1.5 + (0.12 if stacked else 0.02) * k))
    with publication_style():
        fig, ax = plt.subplots(figsize=(width, 2.6), layout="constrained")
        try:
            if stacked:
                cmap = plt.get_cmap("tab10" if c <= 10 else "tab20")
                # One collection of K rectangles per class: far faster to draw than K * C bar patches.
                top = np.cumsum(hist, axis=1)
                left, right = np.arange(k) - 0.425, np.arange(k) + 0.425
                for j in range(c):
                    low = top[:, j] - hist[:, j]
                    boxes = np.stack(
                        [np.c_[left, low], np.c_[right, low], np.c_[right, top[:, j]], np.c_[left, top[:, j]]], axis=1
                    )
                    ax.add_collection(PolyCollection(list(boxes), facecolors=cmap(j), linewidths=0))
                ax.set_xlim(-0.6, k - 0.4)
                ax.set_ylim(0, max(1, int(top[:, -1].max())) * 1.03)
                ax.set_ylabel("Samples on the client")
                ax.grid(False)
                handles = [Patch(color=cmap(j), label=names[j]) for j in range(c)]
                ax.legend(handles=handles, title="Label", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
            else:
                shown = np.ma.masked_equal(hist.T, 0)
                image = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap="viridis", origin="lower")
                fig.colorbar(image, ax=ax, label="Samples")
                ax.set_ylabel("Label")
                ax.grid(False)
                if c <= 40:
                    ax.set_yticks(np.arange(c), names, fontsize=6)
            ax.set_xlabel("Client")
            if k <= LABEL_EVERY_CLIENT:
                ax.set_xticks(np.arange(k), [str(i) for i in range(k)], fontsize=6 if k > 20 else 7)
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=20))
            ax.set_title(textwrap.fill(title, int(width * 12)))
            fig.savefig(path, dpi=DPI, bbox_inches="tight")
        finally:
            plt.close(fig)
    return Path(path)


def plot_client_labels(datamodule: Any, path: str | os.PathLike[str]) -> Path | None:
    """Save ``datamodule``'s per-client label histogram (its ``labelled_split``); ``None`` for regression data."""
    split = datamodule.labelled_split()
    if split is None:
        return None
    labels, parts, title = split
    return plot_label_distribution(labels, parts, path, title=title)
