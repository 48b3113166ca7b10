"""Per-client state over a memory budget spills to disk: same values, same runs, same checkpoints."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import fedlightning
from fedlightning.errors import UnreadableStateError
from fedlightning.federated.state import ClientStateStore, state_bytes
from fedlightning.run import run

from .conftest import compose_config
from .test_lifecycle import _assert_same_run, _killed, _RunsCommand


def _store(tmp_path: Path, budget: int | None) -> ClientStateStore:
    store = ClientStateStore(memory_budget_bytes=budget, spill_dir=tmp_path / "spill")
    for cid in range(4):
        store.set(cid, "memory", torch.full((3,), float(cid)))  # 12 bytes per client
        store.set(cid, "optimizer", {"step": cid, "buf": [torch.arange(2, dtype=torch.float64) + cid]})  # 16 bytes
    return store


def test_enforce_budget_spills_least_recently_used_clients_until_within_budget(tmp_path: Path) -> None:
    store = _store(tmp_path, budget=60)  # 4 clients x 28 bytes = 112 > 60: two must go
    store.get(0, "memory")  # client 0 used last: clients 1 and 2 are the least recently used
    assert store.memory_bytes == 112
    assert store.enforce_budget() == 2
    assert store.memory_bytes == 56
    assert sorted(p.name for p in (tmp_path / "spill").glob("*/*.pt")) == ["1.pt", "2.pt"]
    assert list(store.clients()) == [0, 1, 2, 3] and len(store) == 4
    assert torch.equal(store.get(2, "memory"), torch.full((3,), 2.0))  # read back on access
    assert store.get(1, "optimizer")["step"] == 1
    assert torch.equal(store.get(1, "optimizer")["buf"][0], torch.tensor([1.0, 2.0], dtype=torch.float64))


def test_zero_budget_state_dict_and_reload_equal_the_in_memory_store(tmp_path: Path) -> None:
    spilled, memory = _store(tmp_path, budget=0), _store(tmp_path, budget=None)
    spilled.enforce_budget()
    assert spilled.memory_bytes == 0 and memory.enforce_budget() == 0
    a, b = spilled.state_dict(), memory.state_dict()
    assert a.keys() == b.keys() == {0, 1, 2, 3}
    for cid in a:
        assert torch.equal(a[cid]["memory"], b[cid]["memory"])
        assert torch.equal(a[cid]["optimizer"]["buf"][0], b[cid]["optimizer"]["buf"][0])
    reloaded = ClientStateStore(memory_budget_bytes=0, spill_dir=tmp_path / "again")
    reloaded.load_state_dict(a)
    assert reloaded.memory_bytes == 0 and torch.equal(reloaded.get(3, "memory"), torch.full((3,), 3.0))


def test_restore_undoes_changes_to_clients_read_back_from_disk(tmp_path: Path) -> None:
    store = _store(tmp_path, budget=0)
    store.enforce_budget()
    snapshot = store.snapshot()
    store.get(1, "memory").add_(10.0)  # an in-place update of a client read back from disk
    store.set(9, "memory", torch.ones(1))
    store.restore(snapshot)
    assert torch.equal(store.get(1, "memory"), torch.full((3,), 1.0))
    assert store.get(9, "memory") is None and len(store) == 4


def test_retain_and_close_remove_the_spill_files(tmp_path: Path) -> None:
    store = _store(tmp_path, budget=0)
    store.enforce_budget()
    store.retain(lambda cid: cid % 2 == 0)
    assert list(store.clients()) == [0, 2]
    assert sorted(p.name for p in (tmp_path / "spill").glob("*/*.pt")) == ["0.pt", "2.pt"]
    store.close()
    assert list((tmp_path / "spill").iterdir()) == []


def test_a_spill_file_replaced_by_one_that_runs_code_is_refused_with_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path, budget=0)
    store.enforce_budget()
    (spilled,) = (tmp_path / "spill").glob("*/1.pt")
    marker = tmp_path / "code-ran"
    torch.save({"memory": _RunsCommand(marker)}, spilled)  # unpickling it runs `touch marker`
    torch.load(spilled, weights_only=False)  # the file is live: a full unpickle runs its code
    assert marker.exists()
    marker.unlink()
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    for read in (lambda: store.get(1, "memory"), store.state_dict):
        with pytest.raises(UnreadableStateError) as info:
            read()
        text = str(info.value)
        assert text.startswith(f"The spilled client state {spilled} ") and "\n" not in text
        assert "holds objects other than tensors and plain containers" in text
        assert text.endswith("run the same command again to resume from the run's last checkpoint.")
        assert not marker.exists()
    assert torch.equal(store.get(2, "memory"), torch.full((3,), 2.0))  # the other files still read


def _unsafe_loads(path: Path) -> list[str]:
    """``torch.load`` calls without ``weights_only=True``, and ``pickle.load``/``pickle.loads`` uses, in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module == "pickle":
            found += [f"{where}: from pickle import {a.name}" for a in node.names if a.name in ("load", "loads")]
        elif isinstance(node, ast.Attribute) and ast.unparse(node) in ("pickle.load", "pickle.loads"):
            found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
            safe = any(k.arg == "weights_only" and ast.unparse(k.value) == "True" for k in node.keywords)
            found += [] if safe else [f"{where}: {ast.unparse(node)}"]
    return found


def test_every_file_the_package_reads_is_read_as_data() -> None:
    package = Path(fedlightning.__file__).parent
    sources = sorted(package.rglob("*.py"))
    assert len(sources) > 20 and (package / "federated/state.py") in sources
    assert [f for path in sources for f in _unsafe_loads(path)] == []


def test_state_bytes_counts_nested_tensors_only() -> None:
    assert state_bytes({"a": torch.zeros(3), "b": (torch.zeros(2, dtype=torch.int64), "x", 1)}) == 12 + 16


def test_negative_budget_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="memory budget must be >= 0"):
        ClientStateStore(memory_budget_bytes=-1)


# DIANA keeps a shift per client; top-k with error feedback a memory per client (3 of 5 per round).
STATEFUL = {
    "diana": ["+experiment=diana_digits_quick", "eval_every=1", "compressor=natural_dithering", "data.num_clients=5"],
    "top_k_error_feedback": ["compressor=top_k_ef", "sampler=uniform", "clients_per_round=3", "data.num_clients=5"],
}
RUN = ["rounds=4", "checkpoint_every=1", "logger=csv"]


@pytest.fixture(autouse=True)
def _no_png(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fedlightning.plotting.plot_curves", lambda *args, **kwargs: None)


@pytest.mark.parametrize("method", ["diana", pytest.param("top_k_error_feedback", marks=pytest.mark.slow)])
def test_run_with_a_zero_budget_equals_the_in_memory_run_and_resumes_after_a_kill(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = compose_config([*RUN, *STATEFUL[method]])
    spilled = compose_config([*RUN, *STATEFUL[method], "client_state_memory_mb=0"])
    run(memory, tmp_path / "memory")
    enforce = ClientStateStore.enforce_budget
    counts: list[int] = []
    monkeypatch.setattr(ClientStateStore, "enforce_budget", lambda self: counts.append(enforce(self)) or counts[-1])
    run(spilled, tmp_path / "spilled")
    assert len(counts) >= 4 and min(counts[:4]) >= 3  # every round's clients went to disk
    # client_state_memory_mb is part of the config, not of the results: compare everything else
    _assert_same_run(tmp_path / "memory", tmp_path / "spilled", not_compared=("overrides", "config"))
    saved = {
        f: torch.load(tmp_path / f / "checkpoints/last.ckpt", weights_only=False)["client_state"]
        for f in ("memory", "spilled")
    }
    assert saved["spilled"].keys() == saved["memory"].keys() and len(saved["memory"]) >= 3
    for cid, entries in saved["memory"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(saved["spilled"][cid][key], value), (cid, key)
    assert not list((tmp_path / "spilled" / "client_state").glob("*/*.pt"))  # removed at the end
    # killed mid-round 3 with everything spilled, run again: the same as the in-memory run
    _killed(spilled, tmp_path / "resumed", round_idx=2, where="mid_round")
    run(spilled, tmp_path / "resumed")
    _assert_same_run(
        tmp_path / "memory", tmp_path / "resumed", not_compared=("overrides", "config", "resumed_from_round")
    )
