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
* ``"x+sqrt+rbf:<fingerprint>"``: x ↦ [x, √max(x, 0), κ·exp(−γ‖√max(x, 0) − a_k‖²)_k]
  (dimension 2d + K): the ``x+sqrt`` map followed by Gaussian-kernel similarities to K public
  anchors, a public kernel feature map built once from a public dataset
  (:mod:`ghofl.client.kernel_map`, ``ghofl feature-map``) and named by its fingerprint. The
  linear heads on its statistics are kernel heads (ridge on it approximates kernel ridge
  regression), still from one upload.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, FieldError
from ghofl.stats.meta import EncoderInfo

if TYPE_CHECKING:
    from ghofl.client.kernel_map import KernelMap

#: The elementwise transforms (no parameters).
FEATURE_TRANSFORMS = ("none", "sqrt", "x+sqrt")
#: The kernel transform; its full name carries the map: ``x+sqrt+rbf:<fingerprint>``.
KERNEL_TRANSFORM = "x+sqrt+rbf"
_KERNEL_NAME = re.compile(r"^x\+sqrt\+rbf:([0-9a-f]{16})$")
_CHOICES = "none, sqrt, x+sqrt or x+sqrt+rbf:<kernel-map fingerprint>"


def kernel_map_of(name: str) -> str | None:
    """The kernel-map fingerprint in transform ``name`` (``None`` for the elementwise ones)."""
    m = _KERNEL_NAME.match(name)
    return m.group(1) if m else None


def check_feature_transform(name: str) -> str:
    """``name`` if it names a transform, else :class:`ConfigError` listing the choices."""
    if name in FEATURE_TRANSFORMS or kernel_map_of(name) is not None:
        return name
    if name == KERNEL_TRANSFORM or name.startswith(KERNEL_TRANSFORM + ":"):
        raise FieldError("client.feature_transform", lambda n: (
            f"{n.name('client.feature_transform')} {name!r} must name its kernel map: "
            "x+sqrt+rbf:<fingerprint> (16 hex digits, printed by ghofl feature-map)"))
    raise FieldError("client.feature_transform", lambda n: (
        f"{n.name('client.feature_transform')} must be one of {_CHOICES}; got {name!r}"))


def _kernel_map(name: str) -> KernelMap:
    from ghofl.client.kernel_map import load_kernel_map

    fp = kernel_map_of(name)
    assert fp is not None
    return load_kernel_map(fp)


def transformed_dim(dim: int, name: str) -> int:
    """Output dimension of transform ``name`` on d-dimensional embeddings.

    A kernel transform reads its map file (:class:`ConfigError` if the map takes another d).
    """
    check_feature_transform(name)
    if name == "x+sqrt":
        return 2 * dim
    if kernel_map_of(name) is not None:
        m = _kernel_map(name)
        if m.input_dim != dim:
            raise ConfigError(
                f"the kernel feature map {m.fingerprint} was built for {m.input_dim}-dimensional "
                f"embeddings, not {dim}-dimensional ones; use the map built for this encoder"
            )
        return int(2 * dim + m.n_anchors)
    return dim


def base_dim(dim: int, name: str) -> int:
    """The embedding dimension d that transform ``name`` maps to ``dim``.

    The inverse of :func:`transformed_dim`.
    """
    check_feature_transform(name)
    if name == "x+sqrt":
        return dim // 2
    if kernel_map_of(name) is not None:
        return int(_kernel_map(name).input_dim)
    return dim


def apply_feature_transform(x: NDArray[Any], name: str) -> NDArray[Any]:
    """Apply transform ``name`` to embeddings ``x`` (n, d); returns (n, transformed_dim(d)).

    Same dtype (a kernel transform: float64 for integer input).
    """
    check_feature_transform(name)
    if name == "none":
        return x
    if kernel_map_of(name) is not None:
        return _kernel_map(name).apply(x)
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
    return last if last in FEATURE_TRANSFORMS or kernel_map_of(last) is not None else "none"

