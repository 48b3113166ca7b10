"""Error feedback (thesis Algorithm 4 / Algorithm 6) for biased compressors.

Each client keeps a memory ``e_i`` (zero at start). To send ``v`` (a gradient step ``η g`` or a
model delta Δ) it compresses ``p = e_i + v``, sends ``C(p)`` and keeps ``e_i ← p − C(p)``, where
``C(p)`` is the vector *decoded from the message*, so quantisation of the values (8-bit,
float16) is fed back too. The memory lives in the engine's client state store
(``module.client_state``), so it is checkpointed with the run.

>>> import torch
>>> from fedlightning.compression.sparse import TopK
>>> msg, e = error_feedback_step(TopK(k=1), torch.tensor([1.0, 0.5]), torch.zeros(2), torch.Generator())
>>> msg.decode().tolist(), e.tolist()
([1.0, 0.0], [0.0, 0.5])
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedlightning.compression.operators import Compressor
from fedlightning.federated.message import Message

__all__ = ["MEMORY_KEY", "error_feedback_step"]

MEMORY_KEY = "ef_memory"
"""Key of the error-feedback memory in ``module.client_state``."""


def error_feedback_step(
    compressor: Compressor, update: Tensor, memory: Tensor, generator: torch.Generator
) -> tuple[Message, Tensor]:
    """Compress ``memory + update``; return the message and the new memory (same device as ``update``)."""
    corrected = memory.to(update.device) + update
    message = compressor.compress(corrected, generator)
    new_memory = corrected - message.decode().to(update.device, update.dtype)
    return message, new_memory
