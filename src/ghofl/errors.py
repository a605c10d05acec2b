"""Exception hierarchy. Every message is a full sentence naming the object, the parameter,
what was expected, what was given, and how to fix it."""

from __future__ import annotations


class GhoflError(Exception):
    """Base class of every error raised on purpose by ghofl."""


class GhoflWarning(UserWarning):
    """Warnings about statistically fragile situations (tiny classes, singular covariances)."""


class ConfigError(GhoflError, ValueError):
    """A parameter or configuration value is invalid."""


class StatsValidationError(GhoflError, ValueError):
    """Statistics arrays are malformed (shape, dtype, NaN, negative counts, asymmetry...)."""


class IncompatibleStatsError(GhoflError, ValueError):
    """Two statistics payloads cannot be combined (different mode, dim, classes, encoder...)."""


class StatsFormatError(GhoflError, ValueError):
    """A file is missing, truncated, foreign or written in an unsupported format version."""


class InputError(GhoflError, ValueError):
    """Embeddings or labels given to a client, a head or the CLI are invalid."""


class DataError(GhoflError, ValueError):
    """A dataset could not be found or read."""


class NotFittedError(GhoflError, RuntimeError):
    """A head was used before it was fitted."""


class UnsupportedModeError(GhoflError, ValueError):
    """A head needs statistics that the upload mode does not contain."""


class ProtocolError(GhoflError, ValueError):
    """A protocol message is malformed, out of order, or inconsistent with an earlier stage."""


class AggregationAbortedError(GhoflError, RuntimeError):
    """A secure aggregation round stopped without a result (too few clients remained, or a
    secret could not be recovered); nothing partial was produced."""


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
    """A contribution clashes with one already recorded: another payload under the same
    client id, or the same payload under another client id."""


class WriteError(GhoflError, OSError):
    """An output file could not be written (disk full, permissions...); nothing partial was
    left behind."""


class StatsOverflowError(StatsValidationError):
    """Adding statistics would overflow their int64 counts or float64 sums."""
