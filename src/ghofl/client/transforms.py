"""Elementwise feature transforms applied on the client after the encoder, before statistics.

Every client must apply the same transform, so it is part of the encoder fingerprint
(:func:`transformed_info`): payloads made with and without it cannot be added by mistake.

* ``"none"``: the encoder output as is.
* ``"sqrt"``: x ↦ √max(x, 0), a power transform (Tukey's ladder, β = ½) that makes the skewed,
  non-negative pooled activations of ReLU/ReLU6 networks closer to Gaussian, which the Gaussian
  heads assume.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.stats.meta import EncoderInfo

FEATURE_TRANSFORMS = ("none", "sqrt")


def check_feature_transform(name: str) -> str:
    if name not in FEATURE_TRANSFORMS:
        raise ConfigError(
            f"feature_transform must be one of {', '.join(FEATURE_TRANSFORMS)}; got {name!r}"
        )
    return name


def apply_feature_transform(x: NDArray[Any], name: str) -> NDArray[Any]:
    """Apply transform ``name`` to embeddings ``x`` of shape (n, d); same shape and dtype."""
    check_feature_transform(name)
    if name == "none":
        return x
    out: NDArray[Any] = np.sqrt(np.maximum(x, 0))
    return out


def transformed_info(info: EncoderInfo, name: str) -> EncoderInfo:
    """The fingerprint of ``info`` followed by transform ``name`` (unchanged for ``"none"``)."""
    check_feature_transform(name)
    if name == "none":
        return info
    pre = f"{info.preprocessing}; then {name}" if info.preprocessing else name
    return replace(info, preprocessing=pre)
