"""fedlightning-plot on a sweep: seed bands, the Pareto frontier, readable log ticks, the table."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.ticker import NullFormatter

from fedlightning.callbacks.bits_accuracy import CURVE_FIELDS
from fedlightning.jobs import record_success
from fedlightning.plotting import (
    FRONTIER_LABEL,
    RunData,
    bits_label,
    draw,
    group_runs,
    load_runs,
    main,
    over_axis,
    read_curve,
    table_rows,
)

# (partition, seed) -> (uplink bits per evaluation, val/acc per evaluation); rounds 1, 2, 3.
RUNS = {
    ("iid", 0): ([1000, 2000, 3000], [0.5, 0.7, 0.9]),
    ("iid", 1): ([1000, 2000, 3000], [0.3, 0.5, 0.7]),
    ("dirichlet", 0): ([1000, 2000, 3000], [0.2, 0.4, 0.6]),
    ("dirichlet", 1): ([1100, 2200, 3300], [0.4, 0.4, 0.8]),  # e.g. an entropy-coded uplink
}
STD = math.sqrt(0.02)  # sample std of two values 0.2 apart


def _run_folder(folder: Path, partition: str, seed: int, bits: list[int], acc: list[float]) -> None:
    """A finished job's folder as run() and the CLI write it (summary, status, curve CSV)."""
    folder.mkdir(parents=True)
    overrides = [f"seed={seed}", f"partition={partition}", "rounds=3"]
    summary = {
        "status": "completed",
        "method": "fedavg",
        "data": "digits",
        "partition": partition,
        "rounds": 3,
        "seed": seed,
        "test/acc": acc[-1] - 0.05,
        "val/acc": acc[-1],
        "comm/uplink_bits_total": bits[-1],
        "comm/downlink_bits_total": bits[-1],
        "comm/bits_total": 2 * bits[-1],
        "overrides": overrides,
        "config": {"seed": seed},
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    record_success(folder, overrides=overrides)
    with (folder / "bits_vs_accuracy.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=(*CURVE_FIELDS, "val/acc"))
        writer.writeheader()
        for rnd, (b, a) in enumerate(zip(bits, acc, strict=True), start=1):
            writer.writerow(
                {
                    "round": float(rnd),
                    "comm/uplink_bits_total": float(b),
                    "comm/downlink_bits_total": float(b),
                    "comm/bits_total": float(2 * b),
                    "val/acc": a,
                }
            )


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for num, ((partition, seed), (bits, acc)) in enumerate(RUNS.items()):
        _run_folder(tmp_path / "sweep" / str(num), partition, seed, bits, acc)
    return tmp_path / "sweep"


def test_two_seeds_by_two_partitions_draw_two_lines_of_seed_means_with_std_bands(sweep: Path) -> None:
    groups = group_runs(load_runs([sweep], "val/acc"), "val/acc", "uplink")
    fig = draw(groups, x="uplink", metric="val/acc", hue="partition")
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"dirichlet (n=2)", "iid (n=2)", FRONTIER_LABEL}
    expected = {  # mean over the two seeds, ± their sample std
        "iid (n=2)": ([1000, 2000, 3000], [0.4, 0.6, 0.8], [STD, STD, STD]),
        "dirichlet (n=2)": ([1050, 2100, 3150], [0.3, 0.4, 0.7], [STD, 0.0, STD]),
    }
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2
    for label, (xs, mean, std) in expected.items():
        line = lines[label]
        np.testing.assert_allclose(line.get_xdata(), xs)
        np.testing.assert_allclose(line.get_ydata(), mean)
        (band,) = [b for b in bands if np.allclose(b.get_facecolor()[0][:3], line.get_color()[:3])]
        vertices = band.get_paths()[0].vertices
        want = sorted([(x, m - s) for x, m, s in zip(xs, mean, std, strict=True)]
                      + [(x, m + s) for x, m, s in zip(xs, mean, std, strict=True)])  # fmt: skip
        got = sorted({(round(float(x), 6), round(float(y), 6)) for x, y in vertices})
        np.testing.assert_allclose(got, sorted({(round(x, 6), round(y, 6)) for x, y in want}), atol=1e-9)
    # The frontier of the final points (iid: 3000 bits, 0.8; dirichlet: 3150 bits, 0.7) is iid alone.
    front = lines[FRONTIER_LABEL]
    np.testing.assert_allclose(front.get_xdata(), [3000])
    np.testing.assert_allclose(front.get_ydata(), [0.8])
    # Log axis: only the 1-2-5 major ticks are labelled (the runs span under two decades).
    assert isinstance(ax.xaxis.get_minor_formatter(), NullFormatter)
    low, high = ax.get_xlim()
    assert [bits_label(t) for t in ax.get_xticks() if low <= t <= high] == ["10³", "2×10³"]
    assert ax.get_ylabel() == "Validation accuracy" and ax.get_xlabel() == "Uplink bits"
    (legend,) = fig.legends  # one legend under the panels: the figure keeps its column width
    assert legend.get_title().get_text() == "partition"
    fig.canvas.draw()
    assert legend.get_window_extent().y1 <= ax.get_window_extent().y0


def test_table_gives_final_accuracy_and_bits_to_target_per_group(sweep: Path) -> None:
    groups = group_runs(load_runs([sweep], "val/acc"), "val/acc", "uplink")
    header, rows = table_rows(groups, metric="val/acc", x="uplink", target=0.55)
    assert header == [
        "partition",
        "seeds",
        "final validation accuracy",
        "final uplink bits",
        "uplink bits to validation accuracy 0.55",
    ]
    # iid's mean curve 0.4, 0.6, 0.8 passes 0.55 at 2000 bits; dirichlet's 0.3, 0.4, 0.7 at (3000 + 3300) / 2.
    assert rows == [
        ["dirichlet", "2", f"0.7000 ± {STD:.4f}", "3150", "3150"],
        ["iid", "2", f"0.8000 ± {STD:.4f}", "3000", "2000"],
    ]
    _, rows = table_rows(groups, metric="val/acc", x="uplink", target=0.75)
    assert [row[-1] for row in rows] == ["not reached", "3000"]


def test_cli_writes_png_pdf_and_the_table_of_a_test_metric(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = sweep.parent / "figs" / "acc.png"
    main([str(sweep), "-o", str(out), "--y", "test accuracy", "--x", "total", "--hue", "partition", "--target", "0.75"])
    assert out.stat().st_size > 10_000 and out.with_suffix(".pdf").stat().st_size > 1_000
    table = (out.parent / "acc_table.md").read_text().splitlines()
    assert table[0] == (
        "| partition | seeds | final test accuracy | final bits (uplink + downlink) "
        "| bits (uplink + downlink) to validation accuracy 0.75 |"
    )
    # test/acc = final val/acc - 0.05: iid (0.85, 0.65), dirichlet (0.55, 0.75); x = 2 x uplink.
    assert table[2] == f"| dirichlet | 2 | 0.6500 ± {STD:.4f} | 6300 | not reached |"
    assert table[3] == f"| iid | 2 | 0.7500 ± {STD:.4f} | 6000 | 6000 |"
    with (out.parent / "acc_table.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows[0][:5] == ["partition", "metric", "n", "mean", "std"]
    assert rows[2][:3] == ["iid", "test/acc", "2"]
    assert [float(v) for v in rows[2][3:]] == pytest.approx([0.75, STD, 6000, 6000])
    assert "wrote" in capsys.readouterr().out


def test_validation_loss_is_read_from_metrics_csv_by_column_name(sweep: Path) -> None:
    # Lightning's metrics.csv: training rows carry the round, evaluation rows only the bits.
    folder = sweep / "0"
    (folder / "csv").mkdir()
    (folder / "csv" / "metrics.csv").write_text(
        "comm/bits_total,round,step,val/loss,train/loss,comm/uplink_bits_total\n"
        "2000.0,1.0,0,,2.3,1000.0\n"
        "2000.0,,0,2.2,,1000.0\n"
        "4000.0,2.0,1,,2.1,2000.0\n"
        "4000.0,,1,2.0,,2000.0\n"
    )
    assert read_curve(folder, "val/loss") == [
        {"val/loss": 2.2, "comm/uplink_bits_total": 1000.0, "comm/bits_total": 2000.0, "round": 1.0},
        {"val/loss": 2.0, "comm/uplink_bits_total": 2000.0, "comm/bits_total": 4000.0, "round": 2.0},
    ]


def test_zampling_preset_draws_accuracy_over_m_over_n_with_seed_bands(tmp_path: Path) -> None:
    sweep = tmp_path / "zampling"
    accuracy = {("1", 0): 0.90, ("1", 1): 0.80, ("8", 0): 0.60, ("8", 1): 0.70, ("64", 0): 0.4, ("64", 1): 0.4}
    for num, ((ratio, seed), acc) in enumerate(accuracy.items()):
        folder = sweep / str(num)
        _run_folder(folder, "iid", seed, [1000 // int(ratio)], [acc])
        summary = json.loads((folder / "summary.json").read_text())
        summary["overrides"] = [f"method.compression={ratio}", f"seed={seed}"]
        summary["test/acc_sampled_mean"] = acc
        (folder / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "tradeoff.png"
    main([str(sweep), "-o", str(out), "--preset", "zampling_tradeoff"])
    assert out.is_file() and out.with_suffix(".pdf").is_file()
    groups = group_runs(load_runs([sweep], "test/acc_sampled_mean"), "test/acc_sampled_mean", "uplink")
    fig = draw(over_axis(groups, "method.compression"), x="method.compression", metric="test/acc_sampled_mean")
    ax = fig.axes[0]
    (line,) = ax.get_lines()  # no Pareto frontier over a sweep axis
    np.testing.assert_allclose(line.get_xdata(), [1, 8, 64])
    np.testing.assert_allclose(line.get_ydata(), [0.85, 0.65, 0.4])
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "Compression m/n"
    table = (tmp_path / "tradeoff_table.md").read_text().splitlines()
    assert table[2:] == [
        f"| 1 | 2 | 0.8500 ± {math.sqrt(0.005):.4f} | 1000 |",
        f"| 8 | 2 | 0.6500 ± {math.sqrt(0.005):.4f} | 125 |",
        "| 64 | 2 | 0.4000 ± 0.0000 | 15 |",
    ]


def test_a_test_metric_group_keeps_a_recorded_zero_x_and_is_nan_only_without_one() -> None:
    def run(partition: str, bits: int | None) -> RunData:
        summary = {"test/acc": 0.5, **({} if bits is None else {"comm/uplink_bits_total": bits})}
        return RunData(run_dir=partition, axes={"partition": partition}, summary=summary)

    groups = group_runs([run("iid", 0), run("shards", None)], "test/acc", "uplink")
    assert [g.axes["partition"] for g in groups] == ["iid", "shards"]
    assert groups[0].final_x == 0.0
    assert math.isnan(groups[1].final_x)


# --------------------------------------------------------------------------- honest statistics


def _iid_table_row(out: Path) -> list[str]:
    with Path(f"{out.with_suffix('')}_table.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    return [next(r for r in rows if r["partition"] == "iid")[k] for k in ("n", "mean", "std")]


def test_a_run_present_in_two_sweeps_is_counted_once_and_said_so(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    again = tmp_path / "sweep_again"
    shutil.copytree(sweep, again)  # a second sweep over the same seeds: the same (config, seed) runs
    out = tmp_path / "both.png"
    main([str(sweep), str(again), "-o", str(out), "--hue", "partition"])
    n, mean, std = _iid_table_row(out)
    assert int(n) == 2 and float(mean) == pytest.approx(0.8) and float(std) == pytest.approx(STD)  # not 4 and 0.115
    captured = capsys.readouterr()
    assert f"{again / '0'} repeats {sweep / '0'} (same config and seed, same results): counted once" in captured.err
    assert "4 repeated runs counted once" in captured.out


def test_copies_of_one_run_with_different_results_are_refused_naming_both_folders(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    again = tmp_path / "sweep_again"
    shutil.copytree(sweep, again)
    curve = again / "1" / "bits_vs_accuracy.csv"
    curve.write_text(curve.read_text().replace(",0.7\n", ",0.71\n"))  # seed 1 of iid ended elsewhere
    with pytest.raises(SystemExit) as stop:
        main([str(sweep), str(again), "-o", str(tmp_path / "both.png")])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert f"{sweep / '1'} and {again / '1'} are the same config and seed with different results" in err
    assert not (tmp_path / "both.png").exists()


def test_table_csv_has_numeric_mean_std_and_n_columns(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep.png"
    main([str(sweep), "-o", str(out), "--target", "0.55"])
    with (tmp_path / "sweep_table.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == [
        "partition", "metric", "n", "mean", "std", "final uplink bits", "uplink bits to validation accuracy 0.55",
    ]  # fmt: skip
    assert [(r["partition"], int(r["n"]), float(r["mean"]), float(r["std"])) for r in rows] == [
        ("dirichlet", 2, pytest.approx(0.7), pytest.approx(STD)),
        ("iid", 2, pytest.approx(0.8), pytest.approx(STD)),
    ]
    assert [float(r["uplink bits to validation accuracy 0.55"]) for r in rows] == [3150.0, 2000.0]


def _with(folder: Path, *, overrides: list[str] | None = None, **summary_keys: object) -> None:
    path = folder / "summary.json"
    summary = json.loads(path.read_text())
    if overrides is not None:
        summary["overrides"] = overrides
    summary.update(summary_keys)
    path.write_text(json.dumps(summary))


def test_legend_names_only_the_axes_that_vary(tmp_path: Path) -> None:
    # Two compressors x two seeds, recorded by four different command lines: data.root and logger
    # set on some runs only, rounds=3 written out on some and left at its default (3) on others.
    sweep = tmp_path / "outputs"
    lines = {
        0: ["compressor=qsgd", "seed=0", "data.root=/a", "logger=csv"],
        1: ["compressor=qsgd", "seed=1", "rounds=3"],
        2: ["compressor=none", "seed=0", "logger=wandb", "rounds=3"],
        3: ["compressor=none", "seed=1", "data.root=/b"],
    }
    for num, overrides in lines.items():
        compressor = overrides[0].split("=")[1]
        _run_folder(sweep / str(num), "iid", num % 2, [1000, 2000, 3000], [0.5, 0.6, 0.7 + 0.1 * (num % 2)])
        root = "/a" if "data.root=/a" in overrides else "/b"
        config = {"seed": num % 2, "rounds": 3, "compressor": {"name": compressor}, "data": {"root": root}}
        _with(sweep / str(num), overrides=overrides, config=config)
    groups = group_runs(load_runs([sweep], "val/acc"), "val/acc", "uplink")
    assert [(g.axes, g.seeds) for g in groups] == [({"compressor": "none"}, 2), ({"compressor": "qsgd"}, 2)]
    fig = draw(groups, x="uplink", metric="val/acc")
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["compressor=none (n=2)", "compressor=qsgd (n=2)", FRONTIER_LABEL]


def test_one_pareto_frontier_per_data_set(sweep: Path) -> None:
    # The dirichlet runs are on MNIST instead: same bits, same accuracies, another data set.
    for num in (2, 3):
        _with(sweep / str(num), data="mnist")
    groups = group_runs(load_runs([sweep], "val/acc"), "val/acc", "uplink")
    assert [(g.data, g.axes) for g in groups] == [
        ("digits", {"partition": "iid"}),
        ("mnist", {"partition": "dirichlet"}),
    ]
    fig = draw(groups, x="uplink", metric="val/acc", target=0.75)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["digits, partition=iid", "mnist, partition=dirichlet"]
    for ax, final in zip(panels, [(3000, 0.8), (3150, 0.7)], strict=True):
        (front,) = [line for line in ax.get_lines() if line.get_label() == FRONTIER_LABEL]
        np.testing.assert_allclose(np.c_[front.get_xdata(), front.get_ydata()], [final])  # its own data set's best
        # One group per panel: its legend entry names no axis; the target is a labelled horizontal line.
        assert [list(line.get_ydata()) for line in ax.get_lines()].count([0.75, 0.75]) == 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["all runs (n=2)", FRONTIER_LABEL, "Target: validation accuracy 0.75"]


def test_figure_says_what_the_bands_are_and_that_seeds_redraw_the_split(sweep: Path, tmp_path: Path) -> None:
    groups = group_runs(load_runs([sweep], "val/acc"), "val/acc", "uplink")
    fig = draw(groups, x="uplink", metric="val/acc", hue="partition")
    text = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
    assert "bands: ±1 sample standard deviation" in text
    assert "partition.seed not pinned" in text  # the fixture's configs do not pin it
    for num in range(4):  # pinned: the same split under every seed, nothing to warn about
        _with(sweep / str(num), config={"seed": 0, "partition": {"seed": 0}})
    pinned = draw(group_runs(load_runs([sweep], "val/acc"), "val/acc", "uplink"), x="uplink", metric="val/acc")
    assert "partition.seed" not in " ".join(t.get_text() for t in pinned.texts)


def test_figure_with_long_labels_stays_within_the_text_width(sweep: Path, tmp_path: Path) -> None:
    from PIL import Image

    for num in range(4):  # many overrides, all differing across the runs: long legend entries
        extra = [f"method.client_optimizer.lr=0.0{num}", f"method.local_epochs={num + 1}", "compressor=top_k_natural"]
        _with(sweep / str(num), overrides=[f"seed={num % 2}", f"partition=p{num}", *extra])
    out = tmp_path / "wide.png"
    main([str(sweep), "-o", str(out)])
    width, _ = Image.open(out).size
    assert width <= 7.2 * 300  # a column (3.5 in) per panel at 300 dpi: long entries wrap below


def test_a_run_left_at_the_default_is_labelled_by_what_it_ran() -> None:
    def run(overrides: dict[str, str], method: str, seed: int) -> RunData:
        summary = {"test/acc": 0.5, "method": method, "config": {"seed": seed, "method": {"name": method, "mu": 0}}}
        return RunData(run_dir=f"{method}{seed}", axes={**overrides, "seed": str(seed)}, summary=summary)

    runs = [run({"method": "fedprox"}, "fedprox", 0), run({}, "fedavg", 0), run({}, "fedavg", 1)]
    groups = group_runs(runs, "test/acc", "uplink")
    assert [(g.axes, g.seeds) for g in groups] == [({"method": "fedavg"}, 2), ({"method": "fedprox"}, 1)]
