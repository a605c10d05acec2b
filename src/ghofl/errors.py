"""Exception hierarchy.

Every message is a full sentence naming the object, the parameter, what was expected,
what was given, and how to fix it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol


class GhoflError(Exception):
    """Base class of every error raised on purpose by ghofl."""


class GhoflWarning(UserWarning):
    """Warnings about statistically fragile situations (tiny classes, singular covariances)."""


class ConfigError(GhoflError, ValueError):
    """A parameter or configuration value is invalid."""


class FieldNames(Protocol):
    """How a front end names the options of a federation (``ghofl.server.fields``)."""

    def name(self, path: str) -> str:
        """The option at plan field ``path`` (``"client.clip_norm"``)."""
        ...

    def ask(self, path: str) -> str:
        """The option as a request for a value (``--clip R``)."""
        ...

    def setting(self, path: str, value: object) -> str:
        """The option set to ``value``."""
        ...

    def reset(self, paths: tuple[tuple[str, object], ...]) -> str:
        """A remedy: set any one of the options back to its value."""
        ...


class LibraryNames:
    """The library's names: ``ClientJob clip_norm``, ``AggregationSpec protocol = "plain"``."""

    _OWNERS: ClassVar[dict[str, str]] = {"client": "ClientJob", "aggregation": "AggregationSpec",
                                         "server": "ServerJob"}

    def name(self, path: str) -> str:
        """The option as the library names it: ``ClientJob clip_norm``."""
        part, _, attr = path.partition(".")
        return f"{self._OWNERS.get(part, part)} {attr}"

    def ask(self, path: str) -> str:
        """The option as a request for a value: its :meth:`name`."""
        return self.name(path)

    def setting(self, path: str, value: object) -> str:
        """The option set to ``value``: ``AggregationSpec protocol = "plain"``."""
        literal = f'"{value}"' if isinstance(value, str) else repr(value)
        return f"{self.name(path)} = {literal}"

    def reset(self, paths: tuple[tuple[str, object], ...]) -> str:
        """A remedy that sets any one of the options back to its value."""
        return "set " + " or ".join(self.setting(p, v) for p, v in paths)


class FieldError(ConfigError):
    """An option of a federation is invalid, alone or with others; :attr:`field` names it.

    Parameters
    ----------
    field : str
        Plan field (``"client.transport_dtype"``) to change.
    text : callable
        Renders the message for a :class:`FieldNames`; ``str(error)`` is the library's
        rendering (:class:`LibraryNames`), and each front end renders it in its own names
        (:meth:`render`), so no front end edits a message.
    """

    def __init__(self, field: str, text: Callable[[FieldNames], str]) -> None:
        self.field = field
        self._text = text
        super().__init__(text(LibraryNames()))

    def render(self, names: FieldNames, hint: str = "") -> str:
        """The message in ``names``, with an optional front-end ``hint`` sentence appended."""
        text = self._text(names)
        return f"{text}. {hint}" if hint else text


class StatsValidationError(GhoflError, ValueError):
    """Statistics arrays are malformed (shape, dtype, NaN, negative counts, asymmetry...)."""


class IncompatibleStatsError(GhoflError, ValueError):
    """Two statistics payloads cannot be combined (different mode, dim, classes, encoder...)."""


class StatsFormatError(GhoflError, ValueError):
    """A file is missing, truncated, foreign or written in an unsupported format version."""


class InputError(GhoflError, ValueError):
    """Embeddings or labels given to a client, a head or the CLI are invalid."""


class ClientRefusalError(InputError):
    """A client refuses to send its payload: it lies beyond the round's public bounds.

    Its message (``str``) names only public facts (the check that failed, where, the public
    bound), since a node returns it to the server; :attr:`local_detail` adds the client's own
    values, for the client's log only: never send it.
    """

    def __init__(self, message: str, local_detail: str = "") -> None:
        super().__init__(message)
        self.local_detail = local_detail


class DataError(GhoflError, ValueError):
    """A dataset could not be found or read."""


class NotFittedError(GhoflError, RuntimeError):
    """A head was used before it was fitted."""


class UnsupportedModeError(GhoflError, ValueError):
    """A head needs statistics that the upload mode does not contain."""


class ProtocolError(GhoflError, ValueError):
    """A protocol message is malformed, out of order, or inconsistent with an earlier stage."""


class AggregationAbortedError(GhoflError, RuntimeError):
    """A secure aggregation round stopped without a result; nothing partial was produced.

    Too few clients remained, or a secret could not be recovered.
    """


class TotalOutOfBoundsError(AggregationAbortedError):
    """A decoded total fails the bounds of clipping at R with at most M samples per client.

    The bounds are those of ``ghofl.secure.bounds``: a client sent statistics beyond them, so
    nothing is fitted or released. :attr:`checks` names the failed checks.
    """

    def __init__(self, message: str, checks: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.checks = checks


class MissingExtraError(GhoflError, ImportError):
    """An optional dependency is not installed."""


def require_extra(module: str, extra: str) -> None:
    """Raise :class:`MissingExtraError` naming the extra to install when ``module`` is absent."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(
            f"this feature needs the optional dependency '{module}', which is not installed; "
            f"install it with: pip install 'ghofl[{extra}]'"
        )


class StoreError(GhoflError, ValueError):
    """An aggregation store is missing, foreign, corrupt, or asked for something it lacks."""


class StoreConflictError(StoreError):
    """A contribution clashes with one already recorded.

    Another payload under the same client id, or the same payload under another client id.
    """


class WriteError(GhoflError, OSError):
    """An output file could not be written; nothing partial was left behind.

    E.g. the disk is full, or permissions are missing.
    """


class StatsOverflowError(StatsValidationError):
    """Adding statistics would overflow their int64 counts or float64 sums."""
