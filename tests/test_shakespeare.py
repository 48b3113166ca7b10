"""Shakespeare: vocabulary, windows, LEAF role parsing, TFF HDF5 / LEAF JSON / plain-text sources,
the natural partition and its per-role validation hold-out, and the character LSTM."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlightning.datamodules import (
    DataUnavailableError,
    DigitsDataModule,
    IIDPartition,
    NaturalPartition,
    ShakespeareDataModule,
    grouped_holdout,
    natural_partition,
)
from fedlightning.datamodules.shakespeare import Vocabulary, char_windows, parse_roles
from fedlightning.models import build_model


def test_windows_by_hand() -> None:
    x, y = char_windows(np.array([1, 2, 3, 4, 5], np.uint8), seq_len=2, stride=1, pad=0)
    assert x.tolist() == [[1, 2], [2, 3], [3, 4]] and y.tolist() == [3, 4, 5]
    x, y = char_windows(np.array([9], np.uint8), seq_len=3, stride=1, pad=0)
    assert x.tolist() == [[0, 0, 0]] and y.tolist() == [9]


def test_tff_role_sequence_wraps_speeches() -> None:
    v = Vocabulary("tff")
    assert v.role_sequence([b"d", b"h"]).tolist() == [88, 1, 89, 88, 2, 89]
    leaf = Vocabulary("leaf")
    assert leaf.role_sequence(["a\nb", "c   d"]).tolist() == leaf.encode("a b c d").tolist()


def test_parse_roles_both_layouts() -> None:
    colon = "First Citizen:\nBefore we proceed.\nHear me.\n\nAll:\nSpeak, speak.\n\nFirst Citizen:\nYou are.\n"
    assert parse_roles(colon, play="Cor") == {
        "COR_FIRST_CITIZEN": ["Before we proceed.\nHear me.", "You are."],
        "COR_ALL": ["Speak, speak."],
    }
    gutenberg = "  HAMLET. To be, or not to be,\n      that is the question.\n  OPHELIA. Good my lord.\n\n  Exit.\n"
    assert parse_roles(gutenberg, play="Hamlet") == {
        "HAMLET_HAMLET": ["To be, or not to be,\nthat is the question."],
        "HAMLET_OPHELIA": ["Good my lord."],
    }


def test_tff_offline_counts_and_natural_roles(shared_data_root: Path) -> None:
    dm = ShakespeareDataModule(
        root=str(shared_data_root), num_clients=715, partition=NaturalPartition(), val_fraction=0.0
    )
    dm.setup("fit")
    assert dm.snippet_counts == {"train": 16068, "test": 2356}
    assert len(dm.client_names) == dm.num_clients == 715
    # One client per role: its windows are exactly its own role's windows, in order.
    x, y = dm.client_tensors(0)
    role = dm.client_names[0]
    import h5py

    with h5py.File(shared_data_root / "shakespeare" / "shakespeare_train.h5") as f:
        speeches = list(f["examples"][role]["snippets"][()])
    seq = dm.vocab.role_sequence(speeches)
    assert len(y) == len(seq) - 80 and x.dtype == torch.uint8
    assert torch.equal(y, torch.from_numpy(seq[80:].astype(np.int64)))
    assert dm.augment(x[:4], torch.Generator()).dtype == torch.int64
    xb, _ = next(iter(dm.test_dataloader()))
    assert xb.dtype == torch.int64 and xb.shape[1] == 80 and int(xb.max()) < 90


def test_natural_validation_keeps_every_role(shared_data_root: Path) -> None:
    dm = ShakespeareDataModule(
        root=str(shared_data_root), num_clients=715, partition=NaturalPartition(), stride=40, val_fraction=0.2
    )
    dm.setup("fit")
    assert min(dm.client_sizes) >= 1 and dm.num_clients == 715
    n_val = len(dm.val_dataloader().dataset)
    assert 0.15 * (n_val + dm.num_train_samples) < n_val < 0.2 * (n_val + dm.num_train_samples) + 1


def test_natural_merges_roles_and_rejects_too_many_clients(shared_data_root: Path) -> None:
    dm = ShakespeareDataModule(root=str(shared_data_root), num_clients=100, partition=NaturalPartition(), stride=80)
    dm.setup("fit")
    groups = dm.natural_groups()
    assert groups is not None and len(np.unique(groups)) == 715
    # Each role lies on exactly one client: map the client's windows back to their roles.
    seen: set[int] = set()
    for k in range(100):
        roles = set(np.unique(groups[dm.train_index[dm.client_indices(k)]]).tolist())
        assert roles and not roles & seen
        seen |= roles
    assert len(seen) == 715
    too_many = ShakespeareDataModule(
        root=str(shared_data_root), num_clients=716, partition=NaturalPartition(), stride=80
    )
    with pytest.raises(ValueError, match=r"data\.num_clients=715"):
        too_many.setup("fit")


def test_natural_partition_pure() -> None:
    groups = np.array([3, 3, 7, 1, 7, 7])
    parts = natural_partition(groups, 3, seed=0, groups=groups)
    assert [p.tolist() for p in parts] == [[3], [0, 1], [2, 4, 5]]
    thirty = np.repeat(np.arange(10), 3)
    merged = natural_partition(thirty, 4, seed=1, groups=thirty)
    assert sorted(len(p) for p in merged) == [6, 6, 9, 9]
    assert all(len(set(np.repeat(np.arange(10), 3)[p] % 100)) == len(p) // 3 for p in merged)
    held, kept = grouped_holdout(np.array([0, 0, 0, 0, 0, 1, 2, 2]), 0.4, np.arange(8))
    assert held.tolist() == [0, 1, 6] and sorted(kept.tolist()) == [2, 3, 4, 5, 7]


def test_natural_partition_fast_and_exact_for_10000_groups() -> None:
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 10_000, size=100_000)
    groups[:10_000] = np.arange(10_000)
    started = time.perf_counter()
    parts = natural_partition(groups, 10_000, seed=rng, groups=groups)
    assert time.perf_counter() - started < 5.0
    idx = np.concatenate(parts)
    assert np.array_equal(np.sort(idx), np.arange(100_000))
    assert all(len(np.unique(groups[p])) == 1 for p in parts[:50])


def test_natural_partition_needs_natural_data() -> None:
    with pytest.raises(ValueError, match="partition=natural needs a data set with natural clients"):
        DigitsDataModule(num_clients=5, partition=NaturalPartition()).setup("fit")


def test_leaf_json_source(tmp_path: Path) -> None:
    for split, users in (("train", {"A": 3, "B": 2}), ("test", {"A": 1, "B": 1})):
        folder = tmp_path / "shakespeare" / "leaf" / split
        folder.mkdir(parents=True)
        data = {
            u: {"x": [("to be or not " * 8)[i : i + 80] for i in range(n)], "y": ["t"] * n} for u, n in users.items()
        }
        raw = {"users": list(users), "num_samples": list(users.values()), "user_data": data}
        (folder / "all_data_0.json").write_text(json.dumps(raw))
    dm = ShakespeareDataModule(root=str(tmp_path), num_clients=2, partition=NaturalPartition(), val_fraction=0.0)
    dm.setup("fit")
    assert dm.client_names == ["A", "B"] and dm.client_sizes == [3, 2]
    v = Vocabulary("tff")
    assert dm.client_tensors(0)[0][1].tolist() == v.encode(("to be or not " * 8)[1:81]).tolist()


def test_text_source_on_tinyshakespeare(shared_data_root: Path) -> None:
    dm = ShakespeareDataModule(
        root="/nonexistent",
        source="text",
        text_file=str(shared_data_root / "shakespeare" / "tinyshakespeare.txt"),
        num_clients=10,
        partition=IIDPartition(),
        stride=40,
        val_fraction=0.0,
    )
    dm.setup("fit")
    roles = len(dm.client_names)
    assert 100 < roles < 2000 and "TINYSHAKESPEARE_FIRST_CITIZEN" in dm.client_names
    assert dm.snippet_counts["train"] > dm.snippet_counts["test"] > 0


def test_missing_files_and_failed_download_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataUnavailableError, match=r"shakespeare_train\.h5.*data\.root="):
        ShakespeareDataModule(root=str(tmp_path)).setup("fit")
    import torchvision.datasets.utils as tvu

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("no network")

    monkeypatch.setattr(tvu, "download_and_extract_archive", offline)
    with pytest.raises(DataUnavailableError, match=r"Shakespeare.*shakespeare_train\.h5.*data\.root="):
        ShakespeareDataModule(root=str(tmp_path), download=True).prepare_data()


def test_char_lstm_preset_counts_and_shape() -> None:
    model = build_model("char_lstm", input_shape=(80,), num_classes=90)
    # embedding 90*8 + LSTM 4*256*(8+256+2) + 4*256*(256+256+2) + head 256*90+90
    assert sum(p.numel() for p in model.parameters()) == 720 + 272_384 + 526_336 + 23_130
    assert model(torch.zeros(2, 80, dtype=torch.int64)).shape == (2, 90)
    with pytest.raises(ValueError, match="char_lstm"):
        build_model("char_lstm", input_shape=(1, 28, 28), num_classes=10)


def test_presets_refuse_inputs_of_the_other_kind() -> None:
    # An MLP would take the 80 character ids as features (and fail on their int64 dtype mid-run);
    # the LSTM would embed 80 real-valued features as ids.
    with pytest.raises(
        ValueError, match=r"^model=mlp takes features but data=shakespeare gives windows of token ids .*model=char_lstm"
    ):
        build_model("mlp", input_shape=(80,), num_classes=90, data_name="shakespeare", token_inputs=True)
    with pytest.raises(ValueError, match=r"^model=char_lstm embeds token ids but data=golub gives features"):
        build_model("char_lstm", input_shape=(80,), num_classes=2, data_name="golub", token_inputs=False)
    assert build_model("char_lstm", input_shape=(80,), num_classes=90, token_inputs=True)(
        torch.zeros(1, 80, dtype=torch.int64)
    ).shape == (1, 90)
