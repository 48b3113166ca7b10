"""Variants of a method as small strategy objects, chosen by name or built from a ``_target_`` config.

A method key such as ``method.constraint`` takes either a name from the method's table
(``method.constraint=inequality``) or a strategy object that Hydra builds from a ``_target_``
(``method.constraint._target_=fedlightning.methods.eflops_lagrangian.Inequality``);
:meth:`Strategy.choose` turns both into the strategy and refuses anything else in one sentence.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Mapping
from typing import ClassVar, Self

from fedlightning.errors import ConfigError

__all__ = ["Strategy"]


class Strategy(ABC):
    """A stateless variant of one step of a method; ``name`` is its value in the config table.

    Two strategies are equal when they are of the same class (they hold no state).
    """

    name: ClassVar[str]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    @classmethod
    def choose(cls, key: str, value: str | Self, table: Mapping[str, Self]) -> Self:
        """The strategy of ``method.<key>``: ``value`` if it is one of this kind, else the entry of ``table`` it names.

        Raises:
            ConfigError: if ``value`` is neither a strategy of this kind nor a name of ``table``.

        >>> class Rule(Strategy):
        ...     name = "plain"
        >>> Rule.choose("rule", "plain", {"plain": Rule()})
        Rule()
        >>> Rule.choose("rule", "fancy", {"plain": Rule()})
        Traceback (most recent call last):
        ...
        fedlightning.errors.ConfigError: method.rule='fancy' is unknown; choose one of plain.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value in table:
            return table[value]
        raise ConfigError(f"method.{key}={value!r} is unknown; choose one of {', '.join(table)}.")
