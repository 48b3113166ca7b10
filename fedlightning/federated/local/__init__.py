"""Local execution: how a round's clients train, behind one interface with interchangeable backends.

* ``loop`` (:class:`LoopRunner`): each client in turn with autograd; serves every method.
* ``fused`` (:class:`FusedRunner`): each client in turn, each step of a ReLU MLP under
  cross-entropy taken by hand (:mod:`fedlightning.federated.local.fused`).
* ``vectorised`` (:class:`VectorisedRunner`): the share's clients at once, ``torch.func.vmap``
  over stacked parameters and a padded step plan (:mod:`fedlightning.federated.local.vectorised`).

One key, ``local_execution=auto|loop|fused|vectorised`` (a constructor argument of
:class:`~fedlightning.federated.module.FederatedModule`), chooses the backend once per round
(:func:`choose_runner`): a named backend that cannot serve the method stops the run with its
one-sentence refusal; ``auto`` takes the first that serves of ``vectorised`` (on CUDA only),
``fused`` and ``loop``. Every backend gives the loop's results within float rounding on the same
batches (``tests/test_vectorised_cohort.py``, ``tests/test_fused_step.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedlightning.errors import ConfigError
from fedlightning.federated.local.base import (
    BACKENDS,
    ClientResult,
    ClientRunner,
    LocalExecution,
    LocalProgram,
    LocalTraining,
    ResultRows,
    ShareResults,
    engine_base,
    overrides,
    own_local_work,
    resolved_optimizer_factory,
)
from fedlightning.federated.local.fused import FusedRunner
from fedlightning.federated.local.loop import LoopRunner
from fedlightning.federated.local.vectorised import VectorisedRunner

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule

__all__ = [
    "BACKENDS",
    "ClientResult",
    "ClientRunner",
    "FusedRunner",
    "LocalExecution",
    "LocalProgram",
    "LocalTraining",
    "LoopRunner",
    "ResultRows",
    "ShareResults",
    "VectorisedRunner",
    "check_local_execution",
    "choose_runner",
    "engine_base",
    "overrides",
    "own_local_work",
    "resolved_optimizer_factory",
]

RUNNERS: dict[str, type[ClientRunner]] = {"loop": LoopRunner, "fused": FusedRunner, "vectorised": VectorisedRunner}


def check_local_execution(value: object) -> LocalExecution:
    """``value`` if it names a backend or ``auto``; else one sentence naming the choices.

    >>> check_local_execution("fused")
    'fused'
    >>> check_local_execution("vectorized")
    Traceback (most recent call last):
    ...
    fedlightning.errors.ConfigError: local_execution is auto, loop, fused or vectorised (got 'vectorized').
    """
    if value == "auto" or value in BACKENDS:
        return value  # type: ignore[return-value]
    raise ConfigError(f"local_execution is auto, {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]} (got {value!r}).")


def choose_runner(module: FederatedModule, key: LocalExecution) -> tuple[ClientRunner, str]:
    """The backend that runs ``module``'s clients this round, and why it was chosen (for the log).

    ``key`` names a backend (refused in one sentence where it cannot serve) or is ``auto``:
    ``vectorised`` on CUDA, else ``fused``, else ``loop``, each where it serves.
    """
    if key != "auto":
        runner = RUNNERS[key](strict=True)
        reason = runner.refusal(module)
        if reason is not None:
            raise ConfigError(
                f"local_execution={key} cannot run {type(module).__name__}'s clients: {reason}; "
                "set local_execution=auto or loop."
            )
        return runner, f"local_execution={key}"
    passed: list[str] = []
    if module.device.type != "cuda":
        passed.append("vectorised: only on CUDA, as the sequential backends are as fast on a CPU")
    for name in ("vectorised", "fused") if module.device.type == "cuda" else ("fused",):
        runner = RUNNERS[name]()
        reason = runner.refusal(module)
        if reason is None:
            return runner, "; ".join(["local_execution=auto", *passed])
        passed.append(f"{name}: {reason}")
    return LoopRunner(), "; ".join(["local_execution=auto", *passed])
