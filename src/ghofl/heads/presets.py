"""Named sets of head hyperparameters.

``"default"``
    Every head's own defaults: covariance shrinkage chosen from the data (``"auto"``: on the
    held-out part of the statistics when the clients uploaded one, else by an analytic rule from
    the moments), naive Bayes variances floored by both the paper's clamp and scikit-learn's
    smoothing.
``"paper"``
    The fixed values of the paper (Turazza, Picone, Mamei, ICLR 2026) as ghofl shipped them
    before data-driven defaults: LDA / Fisher shrinkage 0.05, QDA 0.1, synthesis 0.05, naive
    Bayes variances clamped at 1e-6 (the paper's code), and every other hyperparameter of the
    trainable heads pinned at its value of that release, so the paper's numbers stay
    reproducible whatever the defaults become.

Explicit head parameters (``--param head.key=value``, ``head_params``) always override a preset.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from ghofl.errors import ConfigError

_TRAINING_PAPER: dict[str, Any] = {
    "fisher_shrinkage": 0.05,
    "fisher_energy": 0.995,
    "fisher_max_dim": 128,
    "fisher_min_dim": 2,
    "tau": 0.9,
    "n_per_class": 4000,
    "syn_shrink": 0.05,
    "syn_class_cov": True,
    "fresh_samples": False,
    "center": False,
    "epochs": 40,
    "val_per_class": 0,
    "patience": None,
    "prior_correction": False,
}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "default": {},
    "paper": {
        "nb": {"var_smoothing": 0.0, "var_floor": 1e-6},
        "lda": {"shrinkage": 0.05, "covariance_divisor": "n-c"},
        "qda": {"shrinkage": 0.1, "shrinkage_target": "scaled_identity",
                "covariance_divisor": "n-1"},
        "fedcgs": {},
        "fishermix": {
            **_TRAINING_PAPER,
            "init": "lda",
            "variant": "linear",
            "scale": 20.0,
            "margin": 0.0,
            "lr": 8e-4,
            "weight_decay": 3e-4,
            "batch_size": 2048,
        },
        "protohyper": {
            **_TRAINING_PAPER,
            "rank": 16,
            "base": "lda",
            "residual_init": "random",
            "teacher": "informative",
            "teacher_blend": None,
            "teacher_scale": "base",
            "qda_shrinkage": 0.1,
            "kd_alpha": 0.4,
            "kd_temperature": 4.0,
            "lr": 1e-3,
            "weight_decay": 5e-4,
            "batch_size": 1024,
        },
    },
}

#: The preset used when none is named.
DEFAULT_PRESET = "default"


def available_presets() -> list[str]:
    """Names of the presets."""
    return list(PRESETS)


def check_preset(name: object) -> str:
    """``name`` if it is a preset; :class:`ConfigError` listing the presets otherwise."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(
            f"unknown preset {name!r}; available presets: {', '.join(available_presets())}"
        )
    return name


def preset_params(name: str, head: str) -> dict[str, Any]:
    """Hyperparameters that preset ``name`` sets for ``head`` (a copy; empty when none)."""
    return copy.deepcopy(PRESETS[check_preset(name)].get(head, {}))


def merge_preset(
    preset: str, names: Sequence[str], head_params: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """Explicit head parameters for ``names``: the preset's, overridden by ``head_params``.

    The preset gives only keys each head accepts; ``head_params`` overrides key by key and is kept
    as given, other heads included.

    Parameters
    ----------
    preset : str
        A name of :func:`available_presets`.
    names : sequence of str
        Registered head names.
    head_params : dict of str to dict, optional
        Explicit parameters (e.g. from ``--param``), which win.

    Returns
    -------
    dict of str to dict
    """
    from ghofl.heads.registry import head_defaults  # loads the heads' base class (scipy)

    check_preset(preset)
    out = {k: dict(v) for k, v in (head_params or {}).items()}
    for name in names:
        accepted = head_defaults(name)
        base = {k: v for k, v in preset_params(preset, name).items() if k in accepted}
        if base:
            out[name] = {**base, **out.get(name, {})}
    return out


__all__ = ["DEFAULT_PRESET", "PRESETS", "available_presets", "check_preset", "merge_preset",
           "preset_params"]
