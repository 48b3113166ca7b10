"""The look of every fedlightning figure: sized for a paper's column, axes named in words, PNG and PDF.

A figure is drawn inside :func:`publication_style` (8 pt text, no top and right spines, embedded
TrueType fonts in the PDF) at :data:`COLUMN_WIDTH` (one column of a two-column paper) or
:data:`TEXT_WIDTH`, and :func:`save_figure` writes it as a 300 dpi PNG and a PDF side by side.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter
from matplotlib.typing import RcKeyType

#: Width in inches of one column of a two-column paper, and of its full text block.
COLUMN_WIDTH = 3.5
TEXT_WIDTH = 7.0
#: Resolution of the PNG copy (the PDF is vector).
PNG_DPI = 300

STYLE: dict[RcKeyType, Any] = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "lines.linewidth": 1.2,
    "lines.markersize": 3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
}

#: ``--x`` choices: (curve column / summary key, axis label in words).
X_AXES: dict[str, tuple[str, str]] = {
    "uplink": ("comm/uplink_bits_total", "Uplink bits"),
    "total": ("comm/bits_total", "Uplink + downlink bits"),
    "rounds": ("round", "Round"),
}
SPLIT_WORDS = {"val": "validation", "test": "test", "train": "training"}
NAME_WORDS = {
    "acc": "accuracy",
    "loss": "loss",
    "r2": "R²",
    "acc_best": "best accuracy",
    "acc_sampled_mean": "accuracy of sampled networks (mean)",
}
#: Sweep axes named in words on an x axis.
AXIS_WORDS = {"method.compression": "Compression m/n", "method.d": "d", "method.density": "Density"}


@contextmanager
def publication_style() -> Iterator[None]:
    """Matplotlib settings of a paper's figure (:data:`STYLE`) for the figures drawn inside."""
    with plt.rc_context(STYLE):
        yield


def sentence(text: str) -> str:
    """``text`` with a capital first letter, for an axis label.

    >>> sentence("validation accuracy"), sentence("R²")
    ('Validation accuracy', 'R²')
    """
    return text[:1].upper() + text[1:]


def metric_key(name: str) -> str:
    """The metric key for a metric named in words or as a key.

    >>> [metric_key(n) for n in ("validation accuracy", "Test loss", "val/r2", "validation R²")]
    ['val/acc', 'test/loss', 'val/r2', 'val/r2']
    """
    if "/" in name:
        return name
    words = name.strip().lower().replace("²", "2").split()
    splits = {v: k for k, v in SPLIT_WORDS.items()} | {k: k for k in SPLIT_WORDS}
    if len(words) < 2 or words[0] not in splits:
        raise ValueError(f"--y {name!r}: name a split and a metric, e.g. 'validation accuracy' or val/acc.")
    rest = " ".join(words[1:])
    names = {v.lower().replace("²", "2"): k for k, v in NAME_WORDS.items()} | {"acc": "acc"}
    return f"{splits[words[0]]}/{names.get(rest, rest.replace(' ', '_'))}"


def metric_words(key: str) -> str:
    """The metric named in words, for table headers (:func:`sentence` of it labels an axis).

    >>> metric_words("val/acc"), metric_words("test/acc_sampled_mean"), metric_words("val/f1")
    ('validation accuracy', 'test accuracy of sampled networks (mean)', 'validation f1')
    """
    split, _, name = key.partition("/")
    return f"{SPLIT_WORDS.get(split, split)} {NAME_WORDS.get(name, name)}".strip()


def x_label(x: str) -> str:
    """The x axis label of ``--x``: bits or rounds, or a sweep axis.

    >>> x_label("total"), x_label("method.compression"), x_label("data.num_clients")
    ('Uplink + downlink bits', 'Compression m/n', 'data.num_clients')
    """
    return X_AXES[x][1] if x in X_AXES else AXIS_WORDS.get(x, x)


def save_figure(fig: Figure, path: str | Path, *, dpi: int = PNG_DPI) -> list[Path]:
    """Write ``fig`` as a PNG (``dpi``) and a PDF next to each other (``path`` with either suffix); close it."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix.lower() in (".png", ".pdf") else path
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for suffix in (".png", ".pdf"):
            out = stem.with_suffix(suffix)
            fig.savefig(out, dpi=dpi, bbox_inches="tight")
            written.append(out)
    finally:
        plt.close(fig)
    return written


def _superscript(n: int) -> str:
    return str(n).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


def bits_label(value: float, _pos: int | None = None) -> str:
    """A log-axis tick label: ``10⁶`` at decades, ``2×10⁶`` between them.

    >>> bits_label(1e6), bits_label(2e6), bits_label(5e-3), bits_label(0.0)
    ('10⁶', '2×10⁶', '5×10⁻³', '')
    """
    if value <= 0 or not math.isfinite(value):
        return ""
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = round(value / 10**exponent, 6)
    if mantissa >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    decade = f"10{_superscript(exponent)}"
    return decade if mantissa == 1 else f"{mantissa:g}×{decade}"


def log_ticks(low: float, high: float, *, max_ticks: int = 6) -> list[float]:
    """Labelled tick positions in [low, high] on a log axis: at least two, at most ``max_ticks``.

    Decades (every k-th when there are many), else 1-2-5 steps, else 1..9 steps, else a linear
    1-2-5 grid for a range narrower than that.

    >>> log_ticks(1e3, 1e9)
    [1000.0, 100000.0, 10000000.0, 1000000000.0]
    >>> log_ticks(1.5e6, 1.2e7), log_ticks(1.4e5, 2.6e5)
    ([2000000.0, 5000000.0, 10000000.0], [150000.0, 200000.0, 250000.0])
    """
    k0, k1 = math.floor(math.log10(low)), math.floor(math.log10(high))
    decades = [10.0**k for k in range(k0, k1 + 1) if low <= 10.0**k <= high]
    if len(decades) >= 2:
        step = math.ceil(len(decades) / max_ticks)
        return decades[::step]
    for subs in ((1, 2, 5), tuple(range(1, 10))):
        ticks = [m * 10.0**k for k in range(k0, k1 + 1) for m in subs if low <= m * 10.0**k <= high]
        if 2 <= len(ticks) <= max_ticks:
            return ticks
    grid = MaxNLocator(nbins=3, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
    return [float(t) for t in grid if low <= t <= high]


def readable_log_axis(ax: Axes, low: float, high: float) -> None:
    """A log x axis over the data's [low, high] whose labels never collide (:func:`log_ticks`)."""
    ax.set_xscale("log")
    pad = 2.0 if high <= low * 1.01 else 1.1
    ax.set_xlim(low / pad, high * pad)
    ax.xaxis.set_major_locator(FixedLocator(log_ticks(low / pad, high * pad)))
    ax.xaxis.set_major_formatter(FuncFormatter(bits_label))
    ax.xaxis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(False, which="minor")
