"""W&B runs: config, group, tags, name, bit axes, results table and artifact, read off the offline files."""

from __future__ import annotations

import json
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from fedlightning.run import run
from fedlightning.tracking import OfflineRun, _chunks, bits_to_target, flat_config, read_offline_run, run_labels

CHOICES = {
    "method": "fedavg",
    "compressor": "natural",
    "downlink": "none",
    "sampler": "full",
    "partition": "dirichlet",
    "data": "digits",
    "model": "digits_mlp",
}


def read_written_offline_run(folder: Path, timeout_s: float = 60.0) -> OfflineRun:
    """The offline run once W&B's writer process has flushed its config and results artifact.

    ``wandb.finish`` can return before that separate process has written its last records (seen
    under two test workers on two cores), so the file is re-read until both are there or the time
    is up; the caller's assertions then say what is missing.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            recorded = read_offline_run(folder)
        except Exception:  # a record cut mid-write does not parse yet
            recorded = None
        results = recorded is not None and any(a["type"] == "run-results" for a in recorded.artifacts)
        if recorded is not None and results and "method" in recorded.config:
            return recorded
        if time.monotonic() > deadline:
            return recorded if recorded is not None else read_offline_run(folder)
        time.sleep(0.25)


def test_wandb_offline_run_carries_config_group_tags_name_and_bit_axes(
    make_config: Callable[..., DictConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb

    wandb.teardown()  # an earlier test's wandb session (WANDB_MODE=disabled) must not be reused
    monkeypatch.setenv("WANDB_MODE", "offline")
    overrides = ["compressor=natural", "seed=3", "rounds=2", "data.root=/somewhere"]
    cfg = make_config(["logger=wandb", "compressor=natural", "seed=3", "rounds=2"])
    sweep = tmp_path / "multirun" / "2026-12-01" / "10-00-00"
    summary = run(cfg, sweep / "0", choices=CHOICES, overrides=overrides, sweep_dir=sweep)
    (folder,) = (sweep / "0" / "wandb").glob("offline-run-*")
    recorded = read_written_offline_run(folder)

    config = recorded.config
    assert (config["method"], config["compressor"], config["partition"], config["seed"]) == (
        "fedavg",
        "natural",
        "dirichlet",
        3,
    )
    assert config["method._target_"] == "fedlightning.methods.FedAvg" and config["rounds"] == 2
    assert config["partition.alpha"] == 0.5  # the flattened resolved config
    assert recorded.group == "compressor=natural rounds=2" and recorded.job_type == "sweep"  # the seed aside
    assert config["setting"] == recorded.group
    assert recorded.name == "compressor=natural seed=3 rounds=2"  # data.root says nothing about the run
    assert recorded.tags == [
        "method:fedavg",
        "compressor:natural",
        "downlink:none",
        "sampler:full",
        "partition:dirichlet",
        "data:digits",
        "sweep:2026-12-01/10-00-00",
    ]
    for name in ("val/acc", "test/acc", "val/loss", "test/loss", "train/loss", "val/acc_best"):
        assert recorded.step_metric(name) == "comm/uplink_bits_total", name
    # The x-axes are in every row of the metrics they carry, and the W&B step is the round.
    rows = [r for r in recorded.history if "val/acc" in r or "test/acc" in r or "train/loss" in r]
    assert len(rows) == 2 + 2 + 1  # two training rows, two evaluations, one test
    assert all({"comm/uplink_bits_total", "comm/bits_total", "round"} <= set(r) for r in rows)
    assert all(r["trainer/global_step"] == r["round"] for r in rows)
    assert [r["round"] for r in rows if "test/acc" in r] == [2]
    assert rows[-1]["comm/uplink_bits_total"] == summary["comm/uplink_bits_total"]
    results = next(a for a in recorded.artifacts if a["type"] == "run-results")
    assert set(results["files"]) >= {
        "summary.json",
        "config.yaml",
        "bits_vs_accuracy.png",
        "bits_vs_accuracy.csv",
        "comm_records.csv",
        "csv/metrics.csv",
    }
    assert "bits_to_target/val/acc>=0.9" in recorded.summary
    assert any("bits_to_target" in a["name"] for a in recorded.artifacts if a["type"] == "run_table")


def test_runs_of_one_setting_share_a_group_across_seeds_and_other_settings_do_not() -> None:
    cfg = OmegaConf.create({"seed": 0, "compressor": {}, "downlink": {}})
    base = {"method": "diana", "data": "golub", "sampler": "full", "partition": "iid"}
    grid = [
        [f"seed={seed}", f"method={method}", f"compressor={compressor}", "data.root=/x"]
        for seed in (0, 1, 2)
        for method in ("diana", "fedavg")
        for compressor in ("top_k", "qsgd")
    ]
    groups = {
        tuple(job): run_labels(cfg, choices=base, overrides=job, sweep_dir="multirun/d/t")["group"] for job in grid
    }
    assert len(set(groups.values())) == 4  # one group per (method, compressor), whatever the seed
    assert groups["seed=0", "method=fedavg", "compressor=qsgd", "data.root=/x"] == "compressor=qsgd method=fedavg"
    assert groups["seed=2", "method=fedavg", "compressor=qsgd", "data.root=/x"] == "compressor=qsgd method=fedavg"
    swept = run_labels(
        cfg,
        choices={**base, "experiment": "diana_golub"},
        overrides=["+experiment=diana_golub"],
        sweep_dir="multirun/d/t",
    )
    assert swept["group"] == "+experiment=diana_golub" and swept["job_type"] == "sweep"
    assert "experiment:diana_golub" in swept["tags"] and "sweep:d/t" in swept["tags"]
    labels = run_labels(cfg, choices=base, overrides=["hydra.run.dir=x", "threads=2", "logger=wandb"])
    assert labels["group"] == "diana-golub" and labels["job_type"] == "train"
    assert labels["name"] == "diana none seed=0"  # no override that changes the run: the choices
    assert "compressor:none" in labels["tags"] and "downlink:none" in labels["tags"]


def test_a_group_longer_than_w_and_b_takes_keeps_settings_apart() -> None:
    cfg = OmegaConf.create({"seed": 0})
    long = [f"method.option_{k}=value_{k}" for k in range(12)]
    a = run_labels(cfg, choices={}, overrides=[*long, "method.lr=0.1"])["group"]
    b = run_labels(cfg, choices={}, overrides=[*long, "method.lr=0.2"])["group"]
    assert len(a) == len(b) == 128 and a != b


def test_flat_config_keeps_every_leaf_under_its_dotted_key() -> None:
    cfg = OmegaConf.create({"seed": 1, "rounds": "${seed}", "method": {"opt": {"lr": 0.1}}, "compressor": {}})
    flat = flat_config(cfg, choices={"method": "fedavg"}, overrides=["seed=1"])
    assert flat["rounds"] == 1 and flat["method.opt.lr"] == 0.1  # resolved
    assert flat["method"] == "fedavg" and flat["compressor"] == "none" and flat["overrides"] == "seed=1"
    assert flat["setting"] == "fedavg-none"  # no override but the seed: the method and data choices


def test_bits_to_target_is_the_first_evaluation_reaching_the_target() -> None:
    points = [
        {"round": 1, "comm/uplink_bits_total": 100, "comm/bits_total": 200, "val/acc": 0.5},
        {"round": 2, "comm/uplink_bits_total": 200, "comm/bits_total": 400, "val/acc": 0.81},
        {"round": 3, "comm/uplink_bits_total": 300, "comm/bits_total": 600, "val/acc": 0.79},
    ]
    assert bits_to_target(points, metric="val/acc", target=0.5)["uplink_bits"] == 100  # >= counts
    assert bits_to_target(points, metric="val/acc", target=0.8) == {
        "target": 0.8,
        "round": 2,
        "uplink_bits": 200,
        "bits": 400,
    }
    assert bits_to_target(points, metric="val/acc", target=0.9)["round"] is None


def test_offline_log_records_are_joined_across_32_kib_blocks() -> None:
    def header(length: int, kind: int) -> bytes:
        return struct.pack("<IHB", 0, length, kind)

    big = bytes(range(256)) * 274  # 70,144 bytes: a FIRST, a MIDDLE and a LAST fragment
    first = 32768 - 7 - 7 - 4  # the block after the file header, a 4-byte FULL record and its header
    data = b":W&B\xe1\xbe\x00" + header(4, 1) + b"abcd"
    data += header(first, 2) + big[:first]
    data += header(32768 - 7, 3) + big[first : first + 32768 - 7]
    rest = big[first + 32768 - 7 :]
    data += header(len(rest), 4) + rest
    assert list(_chunks(data)) == [b"abcd", big]


def test_dashboard_without_the_report_api_writes_the_spec_of_bits_panels_grouped_by_method(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedlightning import dashboard

    monkeypatch.setitem(sys.modules, "wandb_workspaces", None)  # not installed (an import fails)
    assert dashboard.main(["fl-project", "--out", str(tmp_path / "dash")]) == 0
    captured = capsys.readouterr()
    assert "pip install wandb-workspaces" in captured.err and "--from-spec" in captured.out
    spec = json.loads((tmp_path / "dash.json").read_text())
    assert spec["project"] == "fl-project" and spec["runset_groupby"] == ["config.setting"]
    panels = {(p["y"][0], p["x"]): p for p in spec["panels"]}
    assert set(panels) == {
        (y, x) for y in ("val/acc", "test/acc") for x in ("comm/uplink_bits_total", "comm/bits_total", "round")
    }
    assert panels["val/acc", "comm/uplink_bits_total"]["log_x"] and not panels["val/acc", "round"]["log_x"]
    assert all(p["groupby"] == "config.setting" and p["groupby_rangefunc"] == "stddev" for p in panels.values())
    assert (
        "| val/acc vs cumulative uplink bits | val/acc | comm/uplink_bits_total | yes |"
        in (tmp_path / "dash.md").read_text()
    )
