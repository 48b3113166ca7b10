"""torchmetrics without its optional back ends, for the ``fedlightning`` command's start-up.

Lightning imports torchmetrics, and torchmetrics' package import loads every optional back end
that is installed: ``torchvision`` (for image metrics; it pulls in ``torch._dynamo`` and
sympy), ``matplotlib.pyplot`` (for ``Metric.plot``) and ``scipy.signal`` (audio metrics).
fedlightning's metrics (accuracy, R², means) need none of them, and they were most of the
command's start-up. The command (:func:`fedlightning.cli.main`) therefore calls
:func:`install` before it imports Lightning: while torchmetrics itself is being imported
(and only then), :data:`OPTIONAL_BACKENDS` look not installed to it, so it skips them. Once
torchmetrics is imported the hook removes itself; fedlightning's own figures import matplotlib
as usual.

In such a process torchmetrics' image and detection metrics and ``Metric.plot`` report their
back end as missing. A callback that needs them runs with ``FEDLIGHTNING_LEAN_IMPORTS=0``,
which turns the hook off. Importing fedlightning as a library never installs it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["ENV", "OPTIONAL_BACKENDS", "install"]

ENV = "FEDLIGHTNING_LEAN_IMPORTS"
"""``0`` turns the hook off (torchmetrics then imports every back end it finds)."""

OPTIONAL_BACKENDS = ("torchvision", "matplotlib", "scipy")
"""Top-level packages hidden from torchmetrics' availability checks while it is imported."""


class _LeanTorchmetrics(importlib.abc.MetaPathFinder):
    """Finds ``torchmetrics`` as usual, but runs its import with the back ends hidden."""

    def __init__(self, hidden: Sequence[str]) -> None:
        self.hidden = frozenset(hidden)
        self.active = False

    def _hides(self, fullname: str) -> bool:
        return self.active and fullname.partition(".")[0] in self.hidden and fullname not in sys.modules

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        if self._hides(fullname):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        if fullname != "torchmetrics" or self.active:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Wrapped(spec.loader, self)  # type: ignore[assignment]
        return spec

    def find_distributions(self, context: Any = None) -> list[Any]:
        name = getattr(context, "name", None)
        if isinstance(name, str) and self._hides(name.replace("-", "_").lower()):
            raise importlib.metadata.PackageNotFoundError(name)
        return []


class _Wrapped(importlib.abc.Loader):
    """The real loader of ``torchmetrics``, run with the back ends hidden; then the hook goes."""

    def __init__(self, loader: Any, finder: _LeanTorchmetrics) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__.loader = self.loader  # type: ignore[union-attr]  # reloads use the real one
        self.finder.active = True
        try:
            self.loader.exec_module(module)
        finally:
            self.finder.active = False
            if self.finder in sys.meta_path:
                sys.meta_path.remove(self.finder)


def install(hidden: Sequence[str] = OPTIONAL_BACKENDS) -> bool:
    """Hide ``hidden`` from torchmetrics' import, if it is not imported yet; whether the hook is on.

    Packages already imported stay visible (nothing is saved by hiding them).
    """
    if os.environ.get(ENV, "1") == "0" or "torchmetrics" in sys.modules:
        return False
    if any(isinstance(finder, _LeanTorchmetrics) for finder in sys.meta_path):
        return True
    sys.meta_path.insert(0, _LeanTorchmetrics(hidden))
    return True
