"""Random streams derived from (seed, round, client id, purpose).

Every random choice in a federated run draws from a generator derived from these four
coordinates, never from global RNG state. The cohort of a round and each client's batch
order therefore do not depend on how many processes run the round, on the order in which
clients are visited, or on whether the run was resumed from a checkpoint.

>>> a = stream_seed(seed=0, round_idx=3, client_id=7, purpose="batches")
>>> a == stream_seed(seed=0, round_idx=3, client_id=7, purpose="batches")
True
>>> a == stream_seed(seed=0, round_idx=3, client_id=8, purpose="batches")
False
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

SERVER = -1
"""Client id used for streams that belong to the server (cohort selection, server noise)."""


def stream_seed(*, seed: int, round_idx: int, client_id: int, purpose: str) -> int:
    """A 63-bit seed that is a pure function of the four coordinates (BLAKE2b of their text)."""
    key = f"{seed}/{round_idx}/{client_id}/{purpose}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def torch_generator(
    *, seed: int, round_idx: int, client_id: int, purpose: str, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A seeded ``torch.Generator`` for one (seed, round, client, purpose) stream."""
    gen = torch.Generator(device=device)
    gen.manual_seed(stream_seed(seed=seed, round_idx=round_idx, client_id=client_id, purpose=purpose))
    return gen


def numpy_generator(*, seed: int, round_idx: int, client_id: int, purpose: str) -> np.random.Generator:
    """A seeded NumPy generator for one (seed, round, client, purpose) stream."""
    return np.random.default_rng(stream_seed(seed=seed, round_idx=round_idx, client_id=client_id, purpose=purpose))
