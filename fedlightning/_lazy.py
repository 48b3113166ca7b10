"""Lazy package attributes: a name is imported from its submodule on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``package.<exports[name]>`` when ``name`` is first used.

    >>> getattr_ = lazy_getattr("fedlightning.federated", {"Cohort": "cohort"})
    >>> getattr_("Cohort").__name__
    'Cohort'
    """

    def attribute(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return attribute
