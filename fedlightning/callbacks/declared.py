"""The callbacks a method declares: its evaluation reports, attached by whoever builds the trainer.

A method never imports a callback (methods sit below callbacks; ``tests/test_import_layers.py``).
It names the reports it needs in its class attribute ``needed_callbacks``, and the runner
(:func:`fedlightning.run.run`, or a test that builds its own trainer) adds
:func:`declared_callbacks` of the module to the trainer's callbacks, each built from its node of
the config node ``reports`` (``configs/reports/default.yaml``; the node's keys are the keyword arguments of
the report's class, so a method reads none of them):

==========================  ==================================================================
``"sparse_report"``         :class:`~fedlightning.callbacks.sparse_report.SparseModelReport`:
                            density, MACs and selected features of a sparse evaluated network
``"zampling_evaluation"``   :class:`~fedlightning.callbacks.zampling_evaluation.ZamplingEvaluation`:
                            sampled-network accuracies and the sensitivity study (arXiv 2503.14246)
==========================  ==================================================================

The schema checks the keys of ``reports.<name>`` against the report's constructor
(:func:`fedlightning.schema.validate_config`), and the pre-flight refuses a setting of a report
the chosen method does not declare (:func:`fedlightning.preflight.check_reports`).

>>> class Pruned:
...     needed_callbacks = ("sparse_report",)
>>> [type(cb).__name__ for cb in declared_callbacks(Pruned())]
['SparseModelReport']
>>> class Sampled:
...     needed_callbacks = ("zampling_evaluation",)
>>> declared_callbacks(Sampled(), settings={"zampling_evaluation": {"test_samples": 5}})[0].test_samples
5
>>> declared_callbacks(object())
[]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L

from fedlightning.callbacks.sparse_report import SparseModelReport
from fedlightning.callbacks.zampling_evaluation import ZamplingEvaluation

__all__ = ["DECLARABLE", "declared_callbacks", "declared_reports"]

DECLARABLE: dict[str, type[L.Callback]] = {
    "sparse_report": SparseModelReport,
    "zampling_evaluation": ZamplingEvaluation,
}
"""Report name (``needed_callbacks``, and the key under ``reports``) → the callback class, built
with the settings of ``reports.<name>`` as its keyword arguments."""


def declared_reports(method: Any) -> tuple[str, ...]:
    """The report names ``method`` (a class or an instance) declares in ``needed_callbacks``; unknown ones refused.

    >>> class Pruned:
    ...     needed_callbacks = ("sparse_report",)
    >>> declared_reports(Pruned)
    ('sparse_report',)
    """
    names = tuple(getattr(method, "needed_callbacks", ()))
    unknown = [name for name in names if name not in DECLARABLE]
    if unknown:
        owner = method if isinstance(method, type) else type(method)
        raise ValueError(
            f"{owner.__name__}.needed_callbacks names {', '.join(unknown)}; "
            f"the callbacks a method can declare are {', '.join(sorted(DECLARABLE))}."
        )
    return names


def declared_callbacks(module: Any, settings: Mapping[str, Any] | None = None) -> list[L.Callback]:
    """A new instance of each callback ``module``'s ``needed_callbacks`` names, in that order.

    Args:
        module: the method (its class attribute ``needed_callbacks``).
        settings: the config node ``reports``: report name → its keyword arguments. A report
            without a node (or with ``null``) is built with its defaults.
    """
    settings = settings or {}
    return [DECLARABLE[name](**dict(settings.get(name) or {})) for name in declared_reports(module)]
