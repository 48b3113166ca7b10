"""docs/extending.md works as written: its code and configs, copied out of the page, run one round on digits.

The page's Python blocks become ``my_fl.py`` and its YAML blocks the files it names under
``my_configs/``; the page's own compose snippet then runs the toy compressor, sampler and
method together. The uplink bits must be exactly the stream length the compressor defines
(64 header bits + b bits per coordinate, per parameter tensor), every upload must name the
compressor, and the cohort must be the sampler's.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fedlightning.errors import ConfigError

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
SECTIONS = ("A compressor", "A client sampler", "A method")
DIGITS_MLP_TENSORS = (64 * 64, 64, 10 * 64, 10)  # digits_mlp: 64-64-10


def _section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _blocks(text: str, lang: str) -> list[tuple[str, str]]:
    """``(text before, code)`` of each fenced block of ``lang``."""
    return [(m.group(1), m.group(2)) for m in re.finditer(rf"(.*?)```{lang}\n(.*?)```", text, flags=re.S)]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder holding my_fl.py and my_configs/ copied from the page, on sys.path and the cwd."""
    code = []
    for title in SECTIONS:
        section = _section(title)
        code.append(_blocks(section, "python")[0][1])
        before, yaml_text = _blocks(section, "yaml")[0]
        target = re.findall(r"`(my_configs/[\w/]+\.yaml)`", before)[-1]
        (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / target).write_text(yaml_text)
    (tmp_path / "my_fl.py").write_text("\n\n".join(code))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("my_fl", None)


def test_page_compressor_counts_its_stream_and_is_unbiased(project: Path) -> None:
    from my_fl import UniformQuantiser  # type: ignore[import-not-found]

    q = UniformQuantiser(bits=4)
    x = torch.randn(100, generator=torch.Generator().manual_seed(0))
    message = q.compress(x, torch.Generator().manual_seed(1))
    assert message.num_bits == 464 == q.analytic_bits(100)  # the page's "check it by hand"
    decoded = message.decode()
    step = float(x.max() - x.min()) / 15
    assert float((decoded - x).abs().max()) <= step * (1 + 1e-5)
    # Unbiased: the mean of 400 draws is within 5 standard errors (sd <= step/2) of x.
    draws = torch.stack([q(x, torch.Generator().manual_seed(s)) for s in range(400)])
    assert float((draws.mean(0) - x).abs().max()) < 5 * (step / 2) / 400**0.5


def test_page_pieces_run_one_round_on_digits_with_exact_bits(project: Path) -> None:
    snippet = _blocks(_section("Run them"), "python")[0][1]
    quiet = (
        '"rounds=1", "clients_per_round=3", "logger=none", "checkpoint_every=0", "save_partition=false", '
        '"trainer.enable_progress_bar=false",'
    )
    assert '"rounds=5",' in snippet
    namespace: dict[str, Any] = {"MY_CONFIGS": str(project / "my_configs")}
    exec(snippet.replace('"rounds=5",', quiet), namespace)
    summary = namespace["summary"]
    per_upload = sum(64 + 4 * n for n in DIGITS_MLP_TENSORS)
    assert summary["comm/uplink_bits_total"] == 3 * per_upload
    assert summary["config"]["method"]["_target_"] == "my_fl.FedAvgL2"
    run_dir = project / "outputs" / "my_run"
    with open(run_dir / "comm_records.csv") as handle:
        uploads = [r for r in csv.DictReader(handle) if r["direction"] == "up"]
    assert sorted(int(r["client"]) for r in uploads) == [0, 1, 2]  # round robin's first cohort
    assert {r["codec"] for r in uploads} == {"uniform_quantiser/layerwise"}  # one stream per tensor
    assert json.loads((run_dir / "summary.json").read_text())["comm/uplink_bits_total"] == 3 * per_upload


def test_page_compressor_is_refused_on_a_bernoulli_mask(project: Path) -> None:
    from hydra import compose, initialize_config_dir

    from fedlightning.cli import config_dir
    from fedlightning.run import run

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(
            config_name="train",
            overrides=[
                f"hydra.searchpath=[file://{project / 'my_configs'}]",
                "method=zampling",
                "compressor=uniform_quantiser",
                "logger=none",
                "save_partition=false",
            ],
        )
    with pytest.raises(ConfigError, match="uniform_quantiser"):
        run(cfg, project / "refused")


DATA_PAGE = PAGE.with_name("datamodules.md")
DATA_SECTIONS = ("Adding your own data set", "Adding your own model")


@pytest.fixture
def data_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``my_data.py`` and ``my_configs/`` copied from docs/datamodules.md, on sys.path and the cwd."""
    text = DATA_PAGE.read_text()
    code = []
    for title in DATA_SECTIONS:
        start = text.index(f"\n### {title}\n")
        section = text[start : text.find("\n### ", start + 1)]
        code.append(_blocks(section, "python")[0][1])
        before, yaml_text = _blocks(section, "yaml")[0]
        target = re.findall(r"`(my_configs/[\w/]+\.yaml)`", before)[-1]
        (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / target).write_text(yaml_text)
    (tmp_path / "my_data.py").write_text("\n\n".join(code))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("my_data", None)


def test_data_page_dataset_and_model_work_without_hydra(data_project: Path) -> None:
    from my_data import BlobsDataModule, blobs_mlp  # type: ignore[import-not-found]

    from fedlightning.models import ModelInputs

    dm = BlobsDataModule(num_clients=5)
    dm.setup("fit")
    assert (dm.num_train_samples, len(dm.client_sizes)) == (540, 5)  # 600 less the 10 % validation hold-out
    x, _ = dm.client_tensors(0)
    model = blobs_mlp(inputs=ModelInputs(shape=dm.input_shape, num_classes=dm.num_classes))
    assert model(x).shape == (len(x), 3)
    jittered = dm.augment(x, torch.Generator().manual_seed(0))
    assert jittered.shape == x.shape and not torch.equal(jittered, x)
    with pytest.raises(ValueError, match="model=char_lstm"):
        blobs_mlp(inputs=ModelInputs(shape=(80,), num_classes=90, token_inputs=True))


def test_data_page_command_runs_the_dataset_and_model(data_project: Path) -> None:
    from hydra import compose, initialize_config_dir

    from fedlightning.cli import config_dir
    from fedlightning.run import run

    text = DATA_PAGE.read_text()
    command = next(c for _, c in _blocks(text, "bash") if "data=blobs" in c)
    overrides = [o for o in command.split()[3:] if not o.startswith("rounds=")]  # after the search path
    assert overrides == ["data=blobs", "model=blobs_mlp"]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(
            config_name="train",
            overrides=[
                f"hydra.searchpath=[file://{data_project / 'my_configs'}]",
                *overrides,
                "rounds=2",
                "logger=none",
                "checkpoint_every=0",
                "trainer.enable_progress_bar=false",
            ],
        )
    summary = run(cfg, data_project / "outputs" / "blobs")
    assert (summary["data"], summary["model"], summary["num_clients"]) == ("blobs", "blobs_mlp", 10)
    assert summary["config"]["data"]["_target_"] == "my_data.BlobsDataModule"
    params = 2 * 16 + 16 + 16 * 3 + 3  # blobs_mlp on 2 features, 3 classes
    assert summary["comm/uplink_bits_total"] == 2 * 10 * 32 * params  # 2 rounds, every client, float32
    partition = json.loads((data_project / "outputs" / "blobs" / "partition.json").read_text())
    assert partition["dataset"] == "blobs" and partition["num_dataset_samples"] == 600
