"""The callbacks a method declares: its evaluation reports, attached by whoever builds the trainer.

A method never imports a callback (methods sit below callbacks; ``tests/test_import_layers.py``).
It names the reports it needs in its class attribute ``needed_callbacks``, and the runner
(:func:`fedlightning.run.run`, or a test that builds its own trainer) adds
:func:`declared_callbacks` of the module to the trainer's callbacks:

==========================  ==================================================================
``"sparse_report"``         :class:`~fedlightning.callbacks.sparse_report.SparseModelReport`:
                            density, MACs and selected features of a sparse evaluated network
``"zampling_evaluation"``   :class:`~fedlightning.callbacks.zampling_evaluation.ZamplingEvaluation`:
                            sampled-network accuracies and the sensitivity study (arXiv 2503.14246)
==========================  ==================================================================

>>> class Pruned:
...     needed_callbacks = ("sparse_report",)
>>> [type(cb).__name__ for cb in declared_callbacks(Pruned())]
['SparseModelReport']
>>> declared_callbacks(object())
[]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L

from fedlightning.callbacks.sparse_report import SparseModelReport
from fedlightning.callbacks.zampling_evaluation import ZamplingEvaluation

__all__ = ["DECLARABLE", "declared_callbacks"]

DECLARABLE: dict[str, Callable[[Any], L.Callback]] = {
    "sparse_report": lambda module: SparseModelReport(),
    "zampling_evaluation": ZamplingEvaluation.for_module,
}
"""Callback name → the callback built for a module (from the module's own settings)."""


def declared_callbacks(module: Any) -> list[L.Callback]:
    """A new instance of each callback ``module``'s ``needed_callbacks`` names, in that order."""
    names = tuple(getattr(module, "needed_callbacks", ()))
    unknown = [name for name in names if name not in DECLARABLE]
    if unknown:
        raise ValueError(
            f"{type(module).__name__}.needed_callbacks names {', '.join(unknown)}; "
            f"the callbacks a method can declare are {', '.join(sorted(DECLARABLE))}."
        )
    return [DECLARABLE[name](module) for name in names]
