"""Elementwise feature transforms applied on the client after the encoder, before statistics.

Every client must apply the same transform, so it is part of the encoder fingerprint
(:func:`transformed_info`): payloads made with and without it cannot be added by mistake.

* ``"none"``: the encoder output as is.
* ``"sqrt"``: x ↦ √max(x, 0), a power transform (Tukey's ladder, β = ½) that makes the skewed,
  non-negative pooled activations of ReLU/ReLU6 networks closer to Gaussian, which the Gaussian
  heads assume.
* ``"x+sqrt"``: x ↦ [x, √max(x, 0)] (dimension 2d): statistics of this expanded map give the
  linear heads a non-linear (power-basis) decision function of x. It was chosen on a held-out
  part of the CIFAR-10 training split, not on the test set; BENCHMARKS.md (``cifar10_expand``)
  has the test numbers. In ``pooled`` mode the payload grows only with (2d)², so it stays
  smaller than ``full`` mode on x alone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.stats.meta import EncoderInfo

FEATURE_TRANSFORMS = ("none", "sqrt", "x+sqrt")


def check_feature_transform(name: str) -> str:
    if name not in FEATURE_TRANSFORMS:
        raise ConfigError(
            f"feature_transform must be one of {', '.join(FEATURE_TRANSFORMS)}; got {name!r}"
        )
    return name


def transformed_dim(dim: int, name: str) -> int:
    """Output dimension of transform ``name`` on d-dimensional embeddings."""
    return 2 * dim if check_feature_transform(name) == "x+sqrt" else dim


def apply_feature_transform(x: NDArray[Any], name: str) -> NDArray[Any]:
    """Apply transform ``name`` to embeddings ``x`` (n, d); returns (n, transformed_dim(d)),
    same dtype."""
    check_feature_transform(name)
    if name == "none":
        return x
    root: NDArray[Any] = np.sqrt(np.maximum(x, 0))
    if name == "sqrt":
        return root
    out: NDArray[Any] = np.concatenate([x, root], axis=1)
    return out


def transformed_info(info: EncoderInfo, name: str) -> EncoderInfo:
    """The fingerprint of ``info`` followed by transform ``name`` (unchanged for ``"none"``)."""
    check_feature_transform(name)
    if name == "none":
        return info
    pre = f"{info.preprocessing}; then {name}" if info.preprocessing else name
    return replace(info, preprocessing=pre, dim=transformed_dim(info.dim, name))


def recorded_feature_transform(info: EncoderInfo | None) -> str:
    """The transform recorded in ``info`` by :func:`transformed_info` (``"none"`` if none).

    Heads fitted on transformed statistics score transformed embeddings: this tells a caller
    holding raw encoder output which transform to apply first.
    """
    if info is None or not info.preprocessing:
        return "none"
    last = info.preprocessing.rsplit("; then ", 1)[-1].strip()
    return last if last in FEATURE_TRANSFORMS else "none"

