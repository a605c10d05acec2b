"""Declarative hyperparameter constraints of the heads (scikit-learn's ``_parameter_constraints``).

Each head lists its parameters once, as a mapping ``name -> constraint``, in the class
attribute ``parameter_constraints``. :meth:`ghofl.heads.base.Head._validate_params` checks every
parameter against its constraint when the head is fitted and stores the resolved values (e.g.
the string ``"0.1"`` read from a command line as the float 0.1) in the fitted attribute
``params_``; the constructor parameters themselves are never rewritten, so ``get_params()``
returns exactly what the user gave. A violation raises :class:`~ghofl.errors.ConfigError`
naming the head, the parameter, the allowed values and the value given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ghofl.errors import ConfigError
from ghofl.moments.shrinkage import check_shrinkage


class Constraint(Protocol):
    """A parameter constraint: ``resolve`` returns the value to use or raises ``ValueError``."""

    def describe(self) -> str:
        """The allowed values, as a phrase completing "must be ..."."""
        ...

    def resolve(self, value: Any) -> Any:
        """The resolved value; ``ValueError`` when ``value`` is not allowed."""
        ...


def _is_real(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_)


@dataclass(frozen=True)
class Real:
    """A finite real number within [lo, hi] (open ends as flagged), or None when ``none_ok``."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    none_ok: bool = False

    def describe(self) -> str:
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        low = "-inf" if self.lo is None else self.lo
        high = "inf" if self.hi is None else self.hi
        return f"a number in {left}{low}, {high}{right}" + (" or None" if self.none_ok else "")

    def resolve(self, value: Any) -> float | None:
        if value is None and self.none_ok:
            return None
        if not _is_real(value) or not np.isfinite(float(value)):
            raise ValueError(value)
        v = float(value)
        if self.lo is not None and not (v > self.lo if self.lo_open else v >= self.lo):
            raise ValueError(value)
        if self.hi is not None and not (v < self.hi if self.hi_open else v <= self.hi):
            raise ValueError(value)
        return v


@dataclass(frozen=True)
class Integer:
    """An integer >= lo (floats refused, also 2.0), or None when ``none_ok``."""

    lo: int = 0
    none_ok: bool = False

    def describe(self) -> str:
        return f"an integer >= {self.lo}" + (" or None" if self.none_ok else "")

    def resolve(self, value: Any) -> int | None:
        if value is None and self.none_ok:
            return None
        ok = isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)
        if not ok or value < self.lo:
            raise ValueError(value)
        return int(value)


@dataclass(frozen=True)
class Options:
    """One of ``values``; booleans match booleans only (1 is not True)."""

    values: tuple[object, ...]

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)

    def resolve(self, value: Any) -> Any:
        for v in self.values:
            if isinstance(v, bool) != isinstance(value, bool):
                continue  # 1 is not True, and True is not 1
            try:
                same = bool(v == value)
            except (TypeError, ValueError):  # e.g. an array compared elementwise
                same = False
            if same:
                return v
        raise ValueError(value)


@dataclass(frozen=True)
class RealOrAuto:
    """``"auto"`` or a number in [lo, hi) (a numeric string such as ``"0.1"`` is read)."""

    lo: float = 0.0
    hi: float = 1.0

    def describe(self) -> str:
        return f"a number in [{self.lo:g}, {self.hi:g}) or 'auto'"

    def resolve(self, value: Any) -> float | str:
        if value == "auto" and isinstance(value, str):
            return "auto"
        v = value
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise ValueError(value) from None
        if not _is_real(v) or not self.lo <= float(v) < self.hi:
            raise ValueError(value)
        return float(v)


@dataclass(frozen=True)
class ShrinkageParam:
    """A shrinkage coefficient in [0, 1] or a rule (:func:`ghofl.moments.check_shrinkage`)."""

    def describe(self) -> str:
        return "a number in [0, 1] or 'auto'"

    def resolve(self, value: Any) -> Any:
        return value  # checked by :func:`resolve_params` with check_shrinkage's own message


def resolve_params(owner: str, constraints: dict[str, Constraint],
                   params: dict[str, Any]) -> dict[str, Any]:
    """Every parameter of ``params`` checked against its constraint; the resolved values.

    Parameters
    ----------
    owner : str
        The head's class name, first word of every error.
    constraints : dict of str to Constraint
        One entry per parameter; a parameter without an entry is passed through.
    params : dict of str to object
        The values as given (``get_params()``).

    Raises
    ------
    ConfigError
        ``"<owner>: parameter '<name>' must be <allowed>; got <value>"`` (shrinkage
        parameters: ``"<owner>: <name> must be a number in [0, 1] or 'auto'; got ..."``, with
        the named rules listed).
    """
    out: dict[str, Any] = {}
    for name, value in params.items():
        rule = constraints.get(name)
        if rule is None:
            out[name] = value
        elif isinstance(rule, ShrinkageParam):
            try:
                out[name] = check_shrinkage(name, value)
            except ConfigError as exc:
                raise ConfigError(f"{owner}: {exc}") from None
        else:
            try:
                out[name] = rule.resolve(value)
            except ValueError:
                raise ConfigError(
                    f"{owner}: parameter {name!r} must be {rule.describe()}; got {value!r}"
                ) from None
    return out


BOOL = Options((True, False))

__all__ = [
    "BOOL",
    "Constraint",
    "Integer",
    "Options",
    "Real",
    "RealOrAuto",
    "ShrinkageParam",
    "resolve_params",
]
