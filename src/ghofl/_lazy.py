"""Package facades whose names load on first use (PEP 562), so importing a package stays light."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, where: Mapping[str, str]) -> tuple[
        Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a facade whose names live in other modules.

    Parameters
    ----------
    package : str
        The facade's own module name (its ``__name__``).
    where : mapping of str to str
        Exported name -> the module that defines it; each is imported on first access and
        then kept in the facade's namespace.
    """
    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
