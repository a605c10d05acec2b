"""Heads created by name with validated hyperparameters, and parameters as JSON values.

Heads are handled generically through the registry (:mod:`ghofl.heads.registry`): any head
accepting a ``seed`` parameter gets the job's seed, any head accepting ``progress`` gets the
``progress`` flag, unless the head parameters set them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ghofl.errors import ConfigError, UnsupportedModeError
from ghofl.heads.base import Head
from ghofl.heads.presets import DEFAULT_PRESET, check_preset, preset_params
from ghofl.heads.registry import available_heads, head_class, head_defaults, make_head
from ghofl.stats.meta import Mode
from ghofl.stats.schema import mode_supports, modes_supporting

__all__ = ["ESTIMATES", "build_heads", "check_heads_mode", "estimate_mode", "head_defaults",
           "to_jsonable"]


def build_heads(
    names: Sequence[str],
    head_params: dict[str, dict[str, Any]] | None = None,
    *,
    seed: int | None = None,
    progress: bool = False,
    mode: Mode | None = None,
    preset: str = DEFAULT_PRESET,
) -> dict[str, Head]:
    """Create (unfitted) heads by name, checking everything that can be checked before work.

    Parameters
    ----------
    names : sequence of str
        Registered head names.
    head_params : dict of str to dict, optional
        Hyperparameters per head: keys must be registered heads (entries for heads not in
        ``names`` are ignored, so one configuration can serve several head lists), values
        parameters those heads accept.
    seed : int, optional
        Given to every head with a ``seed`` parameter that ``head_params`` does not set.
    progress : bool, default False
        Given to every head with a ``progress`` parameter that ``head_params`` does not set.
    mode : {"full", "pooled", "gram", "diag", "means"}, optional
        Upload mode the heads will be fitted from; a head needing more raises.
    preset : str, default "default"
        Named hyperparameters (:mod:`ghofl.heads.presets`: ``"default"`` data-driven,
        ``"paper"`` the paper's fixed values); ``head_params`` override them key by key.

    Returns
    -------
    dict of str to Head
        In the order of ``names``.

    Raises
    ------
    UnsupportedModeError
        A head's ``min_mode`` is richer than ``mode``.
    ConfigError
        Unknown head, unknown parameter, or invalid parameter value.
    """
    check_preset(preset)
    params = dict(head_params or {})
    registered = available_heads()
    unknown_heads = [h for h in params if h not in registered]
    if unknown_heads:
        raise ConfigError(
            f"parameters were given for {unknown_heads[0]!r}, which is not a registered head; "
            f"available heads: {', '.join(registered)}"
        )
    if mode is not None:
        check_heads_mode(names, mode)
    out: dict[str, Head] = {}
    for name in names:
        defaults = head_defaults(name)
        given = dict(params.get(name, {}))
        unknown = [k for k in given if k not in defaults]
        if unknown:
            valid = ", ".join(sorted(defaults)) or "(none)"
            raise ConfigError(
                f"head {name!r} has no parameter {unknown[0]!r}; valid parameters: {valid}"
            )
        # preset values the head accepts, overridden by explicit parameters
        given = {**{k: v for k, v in preset_params(preset, name).items() if k in defaults},
                 **given}
        if seed is not None and "seed" in defaults:
            given.setdefault("seed", seed)
        if "progress" in defaults:
            given.setdefault("progress", progress)
        head = make_head(name, **given)
        head._validate_params()  # the head's one declarative place for parameter checks
        out[name] = head
    return out


#: What the heads are fitted from: the total of the uploads, or FedCOF's estimate.
ESTIMATES: tuple[str, ...] = ("sum", "fedcof")


def estimate_mode(names: Sequence[str], mode: Mode, estimate: str = "sum") -> Mode:
    """The mode of the statistics ``names`` are fitted from, under ``estimate``.

    ``"sum"``: the upload mode ``mode``. ``"fedcof"``: FedCOF's estimate of the second moments
    from each client's class means and counts (:func:`~ghofl.moments.fedcof.fedcof_statistics`,
    which reads counts and sums, so any upload mode serves), built in mode ``pooled`` (O(d²)
    memory), or ``full`` (every class scatter, O(C d²)) when a head of ``names`` needs it.

    Raises
    ------
    ConfigError
        ``estimate`` is not one of :data:`ESTIMATES`.
    """
    if estimate not in ESTIMATES:
        raise ConfigError(f"estimate must be one of {', '.join(ESTIMATES)}; got {estimate!r}")
    if estimate == "sum":
        return mode
    pooled = all(mode_supports("pooled", head_class(n).min_mode) for n in names)
    return "pooled" if pooled else "full"


def check_heads_mode(names: Sequence[str], mode: Mode, *, estimate: str = "sum") -> None:
    """Raise :class:`UnsupportedModeError` when a head of ``names`` needs more than ``mode``.

    With ``estimate="fedcof"`` the heads are fitted from FedCOF's estimate
    (:func:`estimate_mode`), which every head can read.
    """
    fitted_from = estimate_mode(names, mode, estimate)
    for name in names:
        cls = head_class(name)
        if not mode_supports(fitted_from, cls.min_mode):
            fedcof = (" or, on plain uploads, fit it from FedCOF's covariance estimate of the "
                      "clients' class means (--estimate fedcof)"
                      if mode_supports("pooled", cls.min_mode) else "")
            raise UnsupportedModeError(
                f"head {name!r} needs upload mode {cls.min_mode!r} or richer "
                f"({modes_supporting(cls.min_mode)}), but the statistics "
                f"are mode {mode!r}; compute the client statistics with mode {cls.min_mode!r} "
                f"(--mode {cls.min_mode}){fedcof} or drop {name!r} from the heads"
            )


def to_jsonable(v: Any) -> Any:
    """Hyperparameter values as JSON types (numpy scalars unwrapped, others as strings)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [to_jsonable(i) for i in v]
    if isinstance(v, dict):
        return {str(k): to_jsonable(i) for k, i in v.items()}
    return str(v)
