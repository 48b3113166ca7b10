"""Per-client persistent state, keyed by client id and saved in checkpoints.

Methods keep here whatever a client carries from round to round: error-feedback memory,
DIANA shifts, local scores, control variates, optimiser state. The engine owns the store, so
a method never holds client state in attributes that a checkpoint would miss.

>>> import torch
>>> store = ClientStateStore()
>>> store.set(3, "memory", torch.zeros(2))
>>> store.get(3, "memory")
tensor([0., 0.])
>>> store.get(4, "memory") is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch import Tensor


class ClientStateStore:
    """A dictionary ``client id -> {name: tensor or state dict}`` with checkpoint support.

    Tensors are kept on the device they were stored from; ``state_dict`` moves them to CPU.
    """

    def __init__(self) -> None:
        self._state: dict[int, dict[str, Any]] = {}

    def get(self, client_id: int, key: str, default: Any = None) -> Any:
        """The stored value, or ``default`` when the client has none under ``key``."""
        return self._state.get(client_id, {}).get(key, default)

    def get_or_init(self, client_id: int, key: str, init: Callable[[], Any]) -> Any:
        """The stored value, creating it with ``init()`` on first use."""
        client = self._state.setdefault(client_id, {})
        if key not in client:
            client[key] = init()
        return client[key]

    def set(self, client_id: int, key: str, value: Any) -> None:
        """Store ``value`` for ``client_id`` under ``key``."""
        self._state.setdefault(client_id, {})[key] = value

    def retain(self, keep: Callable[[int], bool]) -> None:
        """Drop the state of every client for which ``keep(client_id)`` is false."""
        self._state = {cid: entries for cid, entries in self._state.items() if keep(cid)}

    def clients(self) -> Iterator[int]:
        """Ids of clients that hold any state."""
        return iter(sorted(self._state))

    def __len__(self) -> int:
        return len(self._state)

    def snapshot(self) -> dict[int, dict[str, Any]]:
        """A copy (tensors cloned, on their devices) that :meth:`restore` brings back."""
        return {cid: {k: _clone(v) for k, v in entries.items()} for cid, entries in self._state.items()}

    def restore(self, snapshot: dict[int, dict[str, Any]]) -> None:
        """Undo every change since ``snapshot`` was taken."""
        self._state = snapshot

    def state_dict(self) -> dict[int, dict[str, Any]]:
        """A CPU copy fit for ``torch.save``."""
        return {cid: {k: _to_cpu(v) for k, v in entries.items()} for cid, entries in self._state.items()}

    def load_state_dict(self, state: dict[int, dict[str, Any]]) -> None:
        """Replace the contents with a saved ``state_dict``."""
        self._state = {int(cid): dict(entries) for cid, entries in state.items()}


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
