"""The client-runner interface: how one round's local work is executed.

A method says *what* a client does (its loss, the hook after each step, its optimiser
factory: :class:`LocalProgram`); a :class:`ClientRunner` says *how* it is executed. Every
runner declares what it serves with :meth:`ClientRunner.refusal` (one sentence, or ``None``)
and is chosen once per round by :func:`fedlightning.federated.local.choose_runner`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule

__all__ = [
    "BACKENDS",
    "ClientResult",
    "ClientRunner",
    "LocalExecution",
    "LocalProgram",
    "LocalTraining",
    "ResultRows",
    "ShareResults",
    "engine_base",
    "overrides",
    "own_local_work",
    "resolved_optimizer_factory",
]

LocalExecution = Literal["auto", "loop", "fused", "vectorised"]
"""The ``local_execution`` key: a backend's name, or ``auto`` (the fastest that serves, per round)."""
BACKENDS: tuple[str, ...] = ("loop", "fused", "vectorised")

OptimizerFactory = Callable[..., torch.optim.Optimizer]


@dataclass
class ClientResult:
    """What local work produced on one client, before encoding.

    Attributes:
        upload: the payload to send (of the method's ``uplink_payload`` kind).
        num_samples: the client's sample count (its FedAvg weight).
        loss: mean local training loss.
        metrics: per-client diagnostics, averaged over the round's uploaders and logged
            under these names (keys must be those of ``client_metric_names``).
    """

    upload: Tensor
    num_samples: int
    loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ResultRows:
    """What local work produced on a whole share at once: the uploads as the rows of one tensor.

    The engine sends, checks and folds such a share in bulk (one channel call, one host read
    of the losses and upload sums, one accounting call); iterating it gives the per-client
    :class:`ClientResult` view.

    Attributes:
        client_ids: the share, in order.
        uploads: (K, d) payloads, row k is client k's (of the method's ``uplink_payload`` kind).
        num_samples: each client's sample count.
        losses: (K,) each client's mean local training loss.
    """

    client_ids: list[int]
    uploads: Tensor
    num_samples: list[int]
    losses: Tensor

    def __post_init__(self) -> None:
        k = len(self.client_ids)
        if self.uploads.shape[0] != k or len(self.num_samples) != k or self.losses.shape != (k,):
            raise ValueError(f"A share of {k} clients as rows needs {k} uploads, sample counts and losses.")

    def __iter__(self) -> Iterator[tuple[int, ClientResult]]:
        for k, client_id in enumerate(self.client_ids):
            yield client_id, ClientResult(upload=self.uploads[k], num_samples=self.num_samples[k], loss=self.losses[k])


ShareResults = Iterable[tuple[int, ClientResult]]
"""A runner's results: each client with its own (a :class:`ResultRows` is one, in bulk)."""


@dataclass
class LocalTraining:
    """What one client's local training did: mean loss, steps, samples and the optimiser."""

    loss: Tensor
    steps: int
    num_samples: int
    optimizer: torch.optim.Optimizer
    epochs: int = 0  # whole passes over the client's data (0 with ``local_steps``)


@dataclass(frozen=True)
class LocalProgram:
    """What a method's client does locally, as :meth:`FederatedModule.local_train` receives it.

    Attributes:
        params: the parameters (or parameter groups) to train, in place.
        batch_loss: the loss of one mini-batch ``(x, y)``; may draw from its own streams.
        after_step: called after each optimiser step (e.g. a projection).
        after_epoch: called after each whole pass with the passes done; true ends training.
        writes_gradients: ``batch_loss`` writes every trained gradient itself (a step taken
            by hand), so no backward pass is run.
    """

    params: Iterable[Tensor] | Iterable[dict[str, Any]]
    batch_loss: Callable[[Tensor, Tensor], Tensor]
    after_step: Callable[[], None] | None = None
    after_epoch: Callable[[int], bool] | None = None
    writes_gradients: bool = False


def own_local_work(cls: type, base: type, hooks: tuple[str, ...], engine_work: str) -> str | None:
    """Why ``cls`` does not run ``engine_work``: the ``hooks`` it defines otherwise than ``base`` (``None``: none).

    >>> class Base:
    ...     def local_loss(self): ...
    >>> class Own(Base):
    ...     def local_loss(self): ...
    >>> own_local_work(Own, Base, ("local_loss",), "the engine's local SGD")
    "its local work is its own (local_loss), not the engine's local SGD"
    """
    own = [h for h in hooks if overrides(cls, base, h)]
    return f"its local work is its own ({', '.join(own)}), not {engine_work}" if own else None


def overrides(cls: type, base: type, hook: str) -> bool:
    """Whether ``cls`` defines ``hook`` otherwise than ``base`` (a hook ``base`` lacks counts as defined).

    >>> class Base:
    ...     def local_loss(self): ...
    >>> overrides(type("Own", (Base,), {"local_loss": lambda self: None}), Base, "local_loss")
    True
    """
    return getattr(cls, hook, None) is not getattr(base, hook, None)


def engine_base(cls: type) -> type:
    """The engine's base class of a method class: the farthest ancestor that declares ``local_work_hooks``."""
    return [c for c in cls.__mro__ if "local_work_hooks" in vars(c)][-1]


def resolved_optimizer_factory(factory: OptimizerFactory, model: nn.Module) -> OptimizerFactory | None:
    """``factory`` as a plain ``functools.partial`` of its optimiser class, for one round's clients.

    A Hydra ``_partial_`` node is a ``functools.partial`` subclass that re-runs Hydra's target
    checks on every call (milliseconds per client). When it wraps a ``torch.optim.Optimizer``
    subclass, it is called once here through Hydra on ``model``'s parameters (so the checks run
    each round on the same target and arguments) and the same class and arguments are then
    called directly. For any other factory the answer is ``None``: call it as it is.
    """
    if not isinstance(factory, functools.partial) or type(factory) is functools.partial:
        return None
    target: Any = factory.func
    if not (isinstance(target, type) and issubclass(target, torch.optim.Optimizer)):
        return None
    try:
        probe = factory(model.parameters())
    except Exception:  # e.g. a factory for other parameters: called as it is, it reports itself
        return None
    if type(probe) is not target:
        return None
    optimizer_class: type[torch.optim.Optimizer] = target
    return functools.partial(optimizer_class, *factory.args, **factory.keywords)


class ClientRunner:
    """Executes one round's local work on this process's share of the cohort.

    By default each client in turn, through the method's ``client_update``, whose local steps
    call :meth:`train`; a backend that trains the share at once overrides :meth:`train_share`.
    """

    name: ClassVar[str]

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        """Chosen by name (``local_execution=<name>``): a client it cannot serve stops the run."""

    def refusal(self, module: FederatedModule) -> str | None:
        """Why this backend cannot run ``module``'s clients this round (``None``: it can)."""
        return None

    @property
    def layers(self) -> list[nn.Linear] | None:
        """The client model's Linear layers when this backend takes steps by hand (else ``None``)."""
        return None

    def begin_round(self, module: FederatedModule) -> None:
        """Called once at the start of each round in which this backend runs."""

    def train_share(
        self,
        module: FederatedModule,
        *,
        round_idx: int,
        share: list[int],
        receive: Callable[[int], Tensor],
        receive_share: Callable[[list[int]], list[Tensor]],
    ) -> ShareResults:
        """Each client of ``share`` (in order) with its result.

        ``receive(cid)`` is one client's decoded downlink; ``receive_share(share)`` observes the
        whole share's downlinks at once (a backend that trains the share together uses it).
        """
        for client_id in share:
            received = receive(client_id)
            yield client_id, module.client_update(client_id=client_id, round_idx=round_idx, received=received)

    def train(self, module: FederatedModule, *, client_id: int, round_idx: int, program: LocalProgram) -> LocalTraining:
        """Local mini-batch training of ``program.params`` on one client's data, in place
        (:meth:`FederatedModule.local_train` hands its program to the round's runner)."""
        raise NotImplementedError(f"the {self.name} backend does not train one client at a time")
