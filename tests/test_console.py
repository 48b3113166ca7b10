"""What the default command prints: few lines, each once, one round-level progress bar."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from fedlightning.console import progress_text, result_text
from fedlightning.run import run

from .conftest import REPO_ROOT

#: Lightning's device and stopping notices, which the console leaves to ``cli.log``.
LIGHTNING_NOTICES = ("GPU available", "TPU available", "max_steps=")


def test_default_command_prints_under_40_lines_each_once_with_one_round_bar(tmp_path: Path) -> None:
    # The default job with fewer rounds: the bar redraws in place (carriage returns), so the
    # line count does not grow with the rounds.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    command = [sys.executable, "-m", "fedlightning.cli", "rounds=4", f"hydra.run.dir={tmp_path}"]
    # Bytes, not text: text mode would turn the bar's carriage returns into line breaks.
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, timeout=300, check=False)
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, output[-3000:]
    lines = [line for line in output.split("\n") if line.strip()]
    assert len(lines) < 40, "\n".join(lines)
    # Each line once (log lines carry a timestamp: compare their messages).
    messages = [line.split("] - ", 1)[-1] for line in lines]
    repeated = [m for m, n in collections.Counter(messages).items() if n > 1]
    assert not repeated, repeated
    bars = [line for line in lines if "round " in line and "/4" in line]
    assert len(bars) == 1
    final = bars[0].split("\r")[-1]
    assert final.startswith("round 4/4 · val acc 0.") and " · uplink " in final and " bits |" in final
    uplink = final.split(" · uplink ")[1].split(" bits")[0]
    assert int(uplink.replace(",", "")) == 4 * 10 * 32 * (64 * 64 + 64 + 64 * 10 + 10)  # an integer, exact
    text = "\n".join(lines)
    for noise in ("Validation", "Epoch 0", "Testing", "litlogger", "LeafSpec", "_target_:", "INFO: "):
        assert noise not in text, noise
    for notice in (*LIGHTNING_NOTICES, "ChannelMetadata("):
        assert notice not in text, notice
    assert "_target_: fedlightning.methods.FedAvg" in (tmp_path / "config.yaml").read_text()


def test_a_compressed_run_prints_no_lightning_notice_and_names_its_compressor_by_its_config_choice(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    command = [sys.executable, "-m", "fedlightning.cli", "rounds=2", "compressor=top_k_ef", f"hydra.run.dir={tmp_path}"]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, timeout=300, check=False)
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, output[-3000:]
    for noise in (*LIGHTNING_NOTICES, "ChannelMetadata("):
        assert noise not in output, noise
    [line] = [line for line in output.splitlines() if "Uplink compressor: " in line]
    assert line.endswith(
        "Uplink compressor: compressor=top_k_ef (top_k(0.01,int8) per layer, 4,810 entries, error feedback; "
        "biased, δ = 106.7)"
    )
    # The notices are not lost: the run folder's log keeps them, each once.
    log_text = (tmp_path / "cli.log").read_text()
    for notice in ("GPU available: ", "TPU available: ", "`Trainer.fit` stopped: `max_steps=2` reached."):
        assert log_text.count(notice) == 1, notice


def test_a_two_process_run_prints_its_result_once_and_no_lightning_advice_on_synced_values(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    command = [sys.executable, "-m", "fedlightning.cli", "rounds=2", "trainer=ddp", f"hydra.run.dir={tmp_path}"]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, timeout=300, check=False)
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, output[-3000:]
    # the evaluation results, the round and the bit totals are the same on both processes
    assert "sync_dist" not in output
    assert sum(" - test/acc " in line for line in output.splitlines()) == 1


def test_print_config_prints_the_resolved_config(
    make_config: Callable[..., DictConfig], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="fedlightning"):
        run(make_config(["rounds=1", "print_config=true", "logger=none"]), tmp_path)
    printed = caplog.text.split("Config:\n", 1)[1]
    written = (tmp_path / "config.yaml").read_text()
    assert printed.startswith(written.splitlines()[0] + "\n")
    for text in (printed, written):
        assert "\nmethod:\n  _target_: fedlightning.methods.FedAvg\n" in text
        assert "\nrounds: 1\n" in text


def test_progress_text_shows_integers_and_the_score() -> None:
    assert progress_text(score_name="acc", score=0.5, uplink_bits=1234567) == "val acc 0.5000 · uplink 1,234,567 bits"
    assert progress_text(score_name="r2", score=None, uplink_bits=7) == "uplink 7 bits"


def test_result_text_prints_a_zero_score_as_zero_and_a_missing_one_as_nan() -> None:
    summary = {
        "comm/uplink_bits_total": 56_461_204_800,
        "comm/uplink_compression": 1.0,
        "comm/downlink_bits_total": 56_461_204_800,
        "time/wall_s": 31.24,
    }
    assert result_text({**summary, "test/acc": 0.0}, score_name="acc") == (
        "test/acc 0.0000 | uplink 56,461,204,800 bits (1× vs float32) | downlink 56,461,204,800 bits | 31.2 s"
    )
    assert result_text({**summary, "test/r2": -0.25}, score_name="r2").startswith("test/r2 -0.2500 | ")
    assert result_text(summary, score_name="acc").startswith("test/acc nan | ")


def test_result_text_prints_a_large_ratio_and_bit_counts_with_thousands_separators() -> None:
    summary = {
        "test/acc": 0.5,
        "comm/uplink_bits_total": 76_960_000,
        "comm/uplink_compression": 1020.4,
        "comm/downlink_bits_total": 2_462_720_000,
        "time/wall_s": 5.0,
    }
    text = result_text(summary, score_name="acc")
    assert "uplink 76,960,000 bits (1,020× vs float32)" in text and "downlink 2,462,720,000 bits" in text
    assert "e+" not in text
