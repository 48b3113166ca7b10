"""Per-client persistent state, keyed by client id and saved in checkpoints.

Methods keep here whatever a client carries from round to round: error-feedback memory,
DIANA shifts, local scores, control variates, optimiser state. The engine owns the store, so
a method never holds client state in attributes that a checkpoint would miss.

With a memory budget (``client_state_memory_mb``) the store spills the least recently used
clients to files in a spill folder when :meth:`ClientStateStore.enforce_budget` runs, which
the engine calls between rounds only: a method may hold a client's tensors and update them
in place during a round, so nothing is moved out while a round can still touch it. A spilled
client is read back on its next access (its file stays until it is spilled again, which keeps
:meth:`~ClientStateStore.snapshot` cheap: a snapshot records which files exist).

>>> import torch
>>> store = ClientStateStore()
>>> store.set(3, "memory", torch.zeros(2))
>>> store.get(3, "memory")
tensor([0., 0.])
>>> store.get(4, "memory") is None
True
"""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedlightning.errors import ConfigError, UnreadableStateError
from fedlightning.federated.rng import SERVER

__all__ = ["ClientStateStore", "state_bytes"]


def state_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (a tensor, or dicts/lists/tuples of them).

    >>> state_bytes({"a": torch.zeros(3), "b": [torch.zeros(2, dtype=torch.float64), 7]})
    28
    """
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(state_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(state_bytes(v) for v in value)
    return 0


class ClientStateStore:
    """A dictionary ``client id -> {name: tensor or state dict}`` with checkpoint support.

    Tensors are kept on the device they were stored from; ``state_dict`` moves them to CPU.

    Args:
        memory_budget_bytes: Most bytes of client tensors kept in memory after
            :meth:`enforce_budget`; ``None`` keeps everything in memory.
        spill_dir: Folder for spilled clients (a fresh folder inside it is used and removed
            by :meth:`close`); ``None`` uses the system's temporary folder.
    """

    def __init__(self, *, memory_budget_bytes: int | None = None, spill_dir: str | Path | None = None) -> None:
        if memory_budget_bytes is not None and (isinstance(memory_budget_bytes, bool) or memory_budget_bytes < 0):
            raise ValueError(f"A client-state memory budget must be >= 0 bytes or None (got {memory_budget_bytes!r}).")
        self.memory_budget_bytes = memory_budget_bytes
        self._spill_root = Path(spill_dir) if spill_dir is not None else None
        self._spill_dir: Path | None = None
        self._state: OrderedDict[int, dict[str, Any]] = OrderedDict()  # least recently used first
        self._on_disk: set[int] = set()  # clients with a current file (used only when not in memory)
        self.spilled_total = 0
        """Clients written to disk so far (for tests and logs)."""
        self.refusal: str | None = None
        """Why per-client entries are refused (the engine sets it when clients are dealt across processes)."""

    # ------------------------------------------------------------------ access
    def _entries(self, client_id: int, create: bool) -> dict[str, Any] | None:
        entries = self._state.get(client_id)
        if entries is not None:
            self._state.move_to_end(client_id)
            return entries
        if client_id in self._on_disk:
            entries = self._read(client_id)
            self._state[client_id] = entries
            return entries
        if create:
            entries = self._state[client_id] = {}
            return entries
        return None

    def get(self, client_id: int, key: str, default: Any = None) -> Any:
        """The stored value, or ``default`` when the client has none under ``key``."""
        entries = self._entries(client_id, create=False)
        return default if entries is None else entries.get(key, default)

    def get_or_init(self, client_id: int, key: str, init: Callable[[], Any]) -> Any:
        """The stored value, creating it with ``init()`` on first use (refused as :meth:`set` is)."""
        client = self._writable(client_id, key)
        if key not in client:
            client[key] = init()
        return client[key]

    def set(self, client_id: int, key: str, value: Any) -> None:
        """Store ``value`` for ``client_id`` under ``key``.

        While :attr:`refusal` is set, a client's entry (not the server's) stops with it.
        """
        self._writable(client_id, key)[key] = value

    def _writable(self, client_id: int, key: str) -> dict[str, Any]:
        """``client_id``'s entries, to write ``key`` into; stops with :attr:`refusal` for a client."""
        if self.refusal is not None and client_id != SERVER:
            raise ConfigError(f"Client {client_id}'s state {key!r} cannot be kept: {self.refusal}.")
        client = self._entries(client_id, create=True)
        assert client is not None
        return client

    def retain(self, keep: Callable[[int], bool]) -> None:
        """Drop the state of every client for which ``keep(client_id)`` is false."""
        self._state = OrderedDict((cid, entries) for cid, entries in self._state.items() if keep(cid))
        for cid in [c for c in self._on_disk if not keep(c)]:
            self._on_disk.discard(cid)
            self._file(cid).unlink(missing_ok=True)

    def clients(self) -> Iterator[int]:
        """Ids of clients that hold any state."""
        return iter(sorted(self._state.keys() | self._on_disk))

    def __len__(self) -> int:
        return len(self._state.keys() | self._on_disk)

    # ------------------------------------------------------------------ memory budget
    @property
    def memory_bytes(self) -> int:
        """Bytes of client tensors held in memory now."""
        return sum(state_bytes(entries) for entries in self._state.values())

    def enforce_budget(self) -> int:
        """Spill least recently used clients to disk until memory is within the budget.

        Call only where no method holds a client's tensors (between rounds). Returns the
        number of clients spilled.
        """
        if self.memory_budget_bytes is None:
            return 0
        held = self.memory_bytes
        spilled = 0
        while held > self.memory_budget_bytes and self._state:
            cid, entries = self._state.popitem(last=False)
            held -= state_bytes(entries)
            try:
                torch.save(entries, self._file(cid))  # tensors come back on their devices
            except RuntimeError as exc:  # torch's writer wraps the OSError of a full disk
                failure = exc.__context__
                if not isinstance(failure, OSError):
                    raise
                failure.filename = failure.filename or str(self._file(cid))
                raise failure from exc  # the run folder's holder tells it in one sentence
            self._on_disk.add(cid)
            spilled += 1
        self.spilled_total += spilled
        return spilled

    def _read(self, client_id: int) -> dict[str, Any]:
        """A spilled client's entries, read as tensors and plain containers only (``weights_only=True``)."""
        path = self._file(client_id)
        try:
            entries = torch.load(path, weights_only=True)  # tensors come back on their devices
        except Exception as exc:  # refused globals, truncation, a missing file: torch raises many types
            text = str(exc).split("WeightsUnpickler error:")[-1].strip()
            if "unsupported global" in text.lower():  # the weights-only unpickler refused to import something
                reason = "it holds objects other than tensors and plain containers, which are not loaded"
            else:
                reason = f"{type(exc).__name__}: {(text.splitlines() or [''])[0].split('. ')[0][:100]}"
        else:
            if isinstance(entries, dict):
                return entries
            reason = f"it holds a {type(entries).__name__}, not a dict"
        raise UnreadableStateError(
            f"The spilled client state {path} is not the tensors this run wrote ({reason}); it was replaced or "
            "damaged while the run was going: run the same command again to resume from the run's last checkpoint."
        )

    def _file(self, client_id: int) -> Path:
        if self._spill_dir is None:
            if self._spill_root is not None:
                self._spill_root.mkdir(parents=True, exist_ok=True)
            self._spill_dir = Path(tempfile.mkdtemp(prefix="client_state_", dir=self._spill_root))
        return self._spill_dir / f"{int(client_id)}.pt"

    def close(self) -> None:
        """Remove the spill folder (the spilled state is lost; save a checkpoint first)."""
        if self._spill_dir is not None:
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None
        self._on_disk.clear()

    # ------------------------------------------------------------------ snapshots and checkpoints
    def snapshot(self) -> tuple[OrderedDict[int, dict[str, Any]], frozenset[int]]:
        """A copy (tensors cloned, on their devices) that :meth:`restore` brings back.

        Spill files are written only by :meth:`enforce_budget`, so recording which exist is
        enough for the spilled clients.
        """
        memory = OrderedDict((cid, {k: _clone(v) for k, v in entries.items()}) for cid, entries in self._state.items())
        return memory, frozenset(self._on_disk)

    def restore(self, snapshot: tuple[OrderedDict[int, dict[str, Any]], frozenset[int]]) -> None:
        """Undo every change since ``snapshot`` was taken."""
        memory, on_disk = snapshot
        self._state = memory
        self._on_disk = set(on_disk)

    def state_dict(self) -> dict[int, dict[str, Any]]:
        """A CPU copy fit for ``torch.save`` (spilled clients are read back from disk)."""
        state = {cid: {k: _to_cpu(v) for k, v in entries.items()} for cid, entries in self._state.items()}
        for cid in self._on_disk - self._state.keys():
            state[cid] = _to_cpu(self._read(cid))
        return dict(sorted(state.items()))

    def load_state_dict(self, state: dict[int, dict[str, Any]]) -> None:
        """Replace the contents with a saved ``state_dict`` (then spill over the budget)."""
        for cid in self._on_disk:
            self._file(cid).unlink(missing_ok=True)
        self._on_disk.clear()
        self._state = OrderedDict((int(cid), dict(entries)) for cid, entries in state.items())
        self.enforce_budget()


def _to_cpu(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _clone(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clone(v) for v in value)
    return value
