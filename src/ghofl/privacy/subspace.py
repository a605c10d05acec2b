"""Fit a private release in a public subspace: post-processing that spends no budget (P0s).

At low ε the noise on a d × d second moment swamps most of its spectrum. A lower-dimensional
release helps, but it need not cost the clients anything: the Gaussian mechanism's noise is
isotropic (σ_A on every coordinate of a class sum; σ_B on the diagonal and σ_B/√2 off it of a
symmetric block, a rotation-invariant law, N2s), so for a public basis V ∈ R^{d × k} with
orthonormal columns

    Vᵀ(A + E_A) = VᵀA + E'_A,    Vᵀ(B + E_B)V = VᵀBV + E'_B,

where E'_A and E'_B have exactly the law of the noise a k-dimensional release with the same σ
would carry. Projecting the noisy total onto V, before the rest of the post-processing, is
therefore the release the clients would have made had they projected their embeddings onto V
(their clipping bound R holds there too, ‖Vᵀz‖ ≤ ‖z‖), at the same (ε, δ); being a function of
the noisy total and public values only, it is post-processing and spends nothing. The fitted
heads carry the projection in their metadata (a ``pca-v1`` :class:`~ghofl.stats.projection.
ProjectionSpec`), so they take d-dimensional embeddings at prediction time.

The per-class diagonals of ``pooled`` mode (naive Bayes' block) are per coordinate of the
encoder's space and do not rotate; in the subspace each class gets the pooled within-class
variance of each coordinate (a shared-variance naive Bayes).

When it pays (``"auto"``)
-------------------------
The noise swamps the spectrum when the entry noise ν = σ_B/(N − C) of the pooled covariance is
large against the scale of its eigenvalues, which clipping at R bounds by R²/d on average. The
public ratio

    ρ = σ_B · d / (R² · (N − C))        (σ_B: the second-moment block's noise; in ``full`` mode
                                         √C·σ_S, the noise of the pooled within scatter)

decides whether the noise calls for fewer dimensions: above :data:`AUTO_MIN_RATIO` the
release is fitted in the first k = round(:data:`AUTO_FRACTION` · d) public principal
directions, provided they hold the classes apart: the share of the release's between-class
energy they keep,

    c_k = Σ_c n_c (‖Vᵀ(μ̃_c − m̃)‖² − k·σ_A²/n_c²) / Σ_c n_c (‖μ̃_c − m̃‖² − d·σ_A²/n_c²)

(μ̃_c = Ã_c/n_c the noisy class means, m̃ their weighted mean, the noise's expected energy
removed), must reach :data:`AUTO_MIN_CAPTURE` even two standard deviations of its noise below
the estimate (:func:`between_capture`); otherwise, and below the ratio, the whole space. N is
the noisy total count; ρ and c_k read only the release and public values. (TREC at ε = 0.5,
about 900 samples a class: single releases' estimates of c_154 ranged from 0.52 to 1, against
0.84 from the exact means; their bounds, 0 to 0.61, keep the whole space. On CIFAR-10 at
ε = 0.5 the estimates are 0.976–0.978 and the bounds 0.968–0.971.)

Calibration (central, best head): on CIFAR-10 (EfficientNet-Lite0, d = 1280, N = 50,000, R = 28,
a basis from Tiny-ImageNet's train images, c_512 = 0.97) ρ = 0.30 / 0.16 at ε = 0.5 / 1, where
k = 512 beats the whole space on the same noise seeds (BENCHMARKS.md "Differential privacy
beside outside anchors", 5 seeds), and ρ ≤ 0.085 from ε = 2, where k = 512 lost 0.5–1.2 points
in a one-off scan (3 seeds; k = 768 and 1,024 fell between); on TREC (MiniLM, d = 384,
N = 5,452, a basis from SST-2 and AG News sentences, c_154 = 0.84) k = 154 lost 1.3–3.8 points
at every ε ≤ 4 in a one-off run (5 seeds) although ρ = 0.12–0.82 there: a basis that misses a
sixth of the classes' separation costs more than the noise it removes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.stats.meta import StatsMeta
from ghofl.stats.projection import (
    PCA_GENERATOR,
    ProjectionSpec,
    default_basis,
    is_fingerprint,
    load_basis,
)

__all__ = [
    "AUTO_FRACTION",
    "AUTO_MIN_CAPTURE",
    "AUTO_MIN_RATIO",
    "SUBSPACE_USAGE",
    "SubspaceChoice",
    "between_capture",
    "check_subspace_option",
    "choose_subspace",
    "named_basis",
    "noise_ratio",
    "project_arrays",
]

#: ``"auto"`` fits in a public subspace when the noise ratio ρ exceeds this.
AUTO_MIN_RATIO = 0.12
#: ``"auto"`` keeps this fraction of the encoder's dimensions (k = round(fraction · d)).
AUTO_FRACTION = 0.4
#: ``"auto"`` projects only when the k directions keep this share of the between-class energy.
AUTO_MIN_CAPTURE = 0.9

SUBSPACE_USAGE = ("expected auto, auto:<basis fingerprint>, none, pca:<k> or "
                  "pca:<k>:<basis fingerprint>, e.g. pca:512")

F64 = NDArray[np.float64]
_SECOND = ("scatter", "class_scatter")


@dataclass(frozen=True)
class SubspaceChoice:
    """Where the release is fitted, and why.

    Attributes
    ----------
    spec : ProjectionSpec or None
        The public principal-direction projection (``None``: the whole space).
    ratio : float or None
        ρ of the release (None when the rule was not consulted).
    reason : str
        The choice in words (recorded among the release's notes).
    """

    spec: ProjectionSpec | None
    ratio: float | None
    reason: str


def check_subspace_option(text: str) -> str:
    """The option's text, checked for form only (the basis is looked up at release time).

    Raises
    ------
    ConfigError
        Not one of the forms of :data:`SUBSPACE_USAGE`.
    """
    if not isinstance(text, str):
        raise ConfigError(f"the DP subspace must be a string; got {text!r}; {SUBSPACE_USAGE}")
    parts = text.strip().split(":")
    ok = parts in (["auto"], ["none"])
    if parts[0] == "auto" and len(parts) == 2:
        ok = is_fingerprint(parts[1])
    if parts[0] == "pca" and len(parts) in (2, 3):
        ok = parts[1].isdigit() and int(parts[1]) >= 1 and (
            len(parts) == 2 or is_fingerprint(parts[2]))
    if not ok:
        raise ConfigError(f"invalid DP subspace {text!r}; {SUBSPACE_USAGE}")
    return text.strip()


def named_basis(text: str) -> str | None:
    """The fingerprint of the basis a (checked) subspace option names, or None.

    ``auto:<fp>`` and ``pca:<k>:<fp>`` name one; ``auto``, ``pca:<k>`` (the encoder's default,
    looked up at release time) and ``none`` do not.
    """
    parts = text.split(":")
    return (parts[1] if parts[0] == "auto" and len(parts) == 2
            else parts[2] if parts[0] == "pca" and len(parts) == 3 else None)


def noise_ratio(sigma: Mapping[str, float], mode: str, num_classes: int, dim: int,
                clip_norm: float, n_total: float) -> float | None:
    """ρ = σ_B·d/(R²·(N − C)) of a release; None for modes without a second moment.

    Parameters
    ----------
    sigma : mapping of str to float
        σ_b per block of the noise the release carries.
    mode : str
        Upload mode.
    num_classes, dim : int
        C and d.
    clip_norm : float
        R.
    n_total : float
        N, the (noisy, clamped) total count.
    """
    if mode == "full":
        sig = math.sqrt(num_classes) * float(sigma.get("class_scatter", 0.0))
    elif mode in ("pooled", "gram"):
        sig = float(sigma.get("scatter", 0.0))
    else:
        return None
    dof = max(float(n_total) - num_classes, 1.0)
    return sig * dim / (clip_norm * clip_norm * dof)


def between_capture(sums: F64, counts: F64, sigma_sums: float,
                    v: F64) -> tuple[float, float]:
    """c_k, the share of the between-class energy of a noisy release that V keeps; a bound.

    With d_c = μ̃_c − m̃ (noisy class means less their weighted mean) and s_c = σ_A²/n_c², the
    kept energy K = Σ_c n_c(‖Vᵀd_c‖² − k·s_c) and the lost energy L = Σ_c n_c(‖(I − VVᵀ)d_c‖²
    − (d − k)·s_c) are unbiased and independent (orthogonal parts of isotropic noise), of
    variances Σ_c n_c²(4s_c‖Vᵀd_c‖² + 2k·s_c²) and Σ_c n_c²(4s_c‖(I − VVᵀ)d_c‖² +
    2(d − k)·s_c²) (plug-in). c_k = K/(K + L); the bound takes K two standard deviations
    lower and L two higher, and is 0 when K + L is within two standard deviations of 0 (no
    separation to tell from the noise): where few samples per class meet a small ε, the
    estimate itself is noise, and the bound says so.

    Parameters
    ----------
    sums : ndarray, shape (C, d)
        Noisy class sums Ã_c (zero for placeholder classes, skipped).
    counts : ndarray, shape (C,)
        Clamped noisy counts n_c.
    sigma_sums : float
        σ_A, the noise on each coordinate of a class sum.
    v : ndarray, shape (d, k)
        Orthonormal columns.

    Returns
    -------
    (float, float)
        c_k and its lower bound, each in [0, 1]; (1.0, 1.0) with fewer than two classes.
    """
    keep = (counts > 0) & np.any(sums != 0.0, axis=1)
    if np.count_nonzero(keep) < 2:
        return 1.0, 1.0
    n = counts[keep].astype(np.float64)
    mu = sums[keep] / n[:, None]
    dev = mu - (n @ mu) / n.sum()
    s = sigma_sums**2 / n**2
    d, k = dev.shape[1], v.shape[1]
    kept_sq = np.sum((dev @ v) ** 2, axis=1)
    lost_sq = np.maximum(np.sum(dev**2, axis=1) - kept_sq, 0.0)
    kept = float(n @ (kept_sq - k * s))
    lost = float(n @ (lost_sq - (d - k) * s))
    sd_kept = math.sqrt(float(n**2 @ (4.0 * s * kept_sq + 2.0 * k * s**2)))
    sd_lost = math.sqrt(float(n**2 @ (4.0 * s * lost_sq + 2.0 * (d - k) * s**2)))

    def share(a: float, b: float) -> float:
        a, b = max(a, 0.0), max(b, 0.0)
        return 1.0 if a + b <= 0.0 else a / (a + b)

    if kept + lost <= 2.0 * math.hypot(sd_kept, sd_lost):  # no separation told from noise
        return share(kept, lost), 0.0
    return share(kept, lost), min(share(kept - 2.0 * sd_kept, lost + 2.0 * sd_lost),
                                  share(kept, lost))


def choose_subspace(option: str, meta: StatsMeta, sigma: Mapping[str, float],
                    n_total: float, sums: F64 | None = None,
                    counts: F64 | None = None) -> SubspaceChoice:
    """Decide the public subspace a noisy release is fitted in (public values only).

    Parameters
    ----------
    option : str
        ``DPConfig.subspace`` (:data:`SUBSPACE_USAGE`): ``auto`` (the rule of the module
        docstring, with the default basis of the encoder the statistics record),
        ``auto:<fp>`` (the rule with this basis), ``none``, ``pca:<k>`` or ``pca:<k>:<fp>``
        (always these k directions).
    meta : StatsMeta
        Metadata of the release (mode, C, d, encoder, projection, R).
    sigma : mapping of str to float
        The noise levels the release carries.
    n_total : float
        N, the noisy total count (public after the release).
    sums, counts : ndarray, optional
        The noisy class sums (C, d) and clamped counts (C,): ``auto`` checks that the basis
        keeps the classes apart (:func:`between_capture`); without them it does not check.

    Raises
    ------
    ConfigError
        An explicit ``pca:<k>`` the release cannot take: the clients already projected, the
        mode has no second moment, k > d, no basis (file, or default for the encoder).
    """
    text = check_subspace_option(option)
    if text == "none":
        return SubspaceChoice(None, None, "fitted in the whole space (DP subspace: none)")
    parts = text.split(":")
    explicit = parts[0] == "pca"
    clip = float(meta.clip_norm or 0.0)
    ratio = None if clip <= 0.0 else noise_ratio(sigma, meta.mode, meta.num_classes,
                                                 meta.dim, clip, n_total)
    if meta.projection is not None or ratio is None:
        why = ("the clients already projected the statistics" if meta.projection is not None
               else "the statistics record no clipping bound" if clip <= 0.0
               else f"mode {meta.mode!r} has no second moment to denoise")
        if explicit:
            raise ConfigError(f"the DP subspace {text!r} cannot be used: {why}; use "
                              "--dp-subspace none")
        return SubspaceChoice(None, ratio, f"fitted in the whole space: {why}")
    d = meta.dim
    if explicit:
        k = int(parts[1])
        if k > d:
            raise ConfigError(f"the DP subspace {text!r} has more directions than the "
                              f"statistics' dimension d={d}; use k <= {d}")
        fp = named_basis(text) or _default_fingerprint(meta, text)
        assert fp is not None
        why = f"DP subspace {text}"
    else:
        if ratio <= AUTO_MIN_RATIO:
            return SubspaceChoice(None, ratio, (
                f"fitted in the whole space: noise ratio rho = sigma_B*d/(R^2*(N-C)) = "
                f"{ratio:.3g} <= {AUTO_MIN_RATIO:g} (DP subspace auto)"))
        k = max(1, round(AUTO_FRACTION * d))
        found = named_basis(text) or _default_fingerprint(meta, None)
        if found is None:
            return SubspaceChoice(None, ratio, (
                f"fitted in the whole space: noise ratio rho = {ratio:.3g} > "
                f"{AUTO_MIN_RATIO:g} asks for a public subspace, but no public basis is "
                "known for the encoder (build one with ghofl projection-basis, or name it: "
                "--dp-subspace auto:<fingerprint>)"))
        fp = found
        why = (f"noise ratio rho = sigma_B*d/(R^2*(N-C)) = {ratio:.3g} > {AUTO_MIN_RATIO:g} "
               f"(DP subspace auto): k = round({AUTO_FRACTION:g}*d)")
    v = load_basis(fp)
    if v.shape[0] != d:
        raise ConfigError(f"public basis {fp} has shape {v.shape} but the statistics have "
                          f"d={d}; use the basis built for this encoder")
    if v.shape[1] < k:
        if explicit:
            raise ConfigError(f"public basis {fp} holds {v.shape[1]} directions; the DP "
                              f"subspace {text!r} needs {k}; use k <= {v.shape[1]}")
        k = int(v.shape[1])
        why += f", capped at the {k} directions of the basis"
    if not explicit and sums is not None and counts is not None:
        capture, low = between_capture(sums, counts, float(sigma.get("sums", 0.0)),
                                       np.asarray(v[:, :k]))
        if low < AUTO_MIN_CAPTURE:
            return SubspaceChoice(None, ratio, (
                f"fitted in the whole space: noise ratio rho = {ratio:.3g} > "
                f"{AUTO_MIN_RATIO:g} asks for a public subspace, but the first {k} "
                f"directions of the public basis {fp} keep only {capture:.3f} of the "
                f"release's between-class energy, at least {low:.3f} < {AUTO_MIN_CAPTURE:g} "
                "within two standard deviations of its noise (DP subspace auto)"))
        why += (f", keeping {capture:.3f} of the between-class energy (at least {low:.3f} "
                "within two standard deviations)")
    spec = ProjectionSpec(0, d, k, PCA_GENERATOR, fp)
    return SubspaceChoice(spec, ratio, (
        f"fitted in the first {k} principal directions of the public basis {fp} "
        f"({why}): the noisy total projected before the rest of the post-processing, which "
        "is the release the clients would have made in that subspace, at no privacy cost"))


def _default_fingerprint(meta: StatsMeta, explicit: str | None) -> str | None:
    enc = meta.encoder
    if enc is None:
        if explicit is not None:
            raise ConfigError(f"the DP subspace {explicit!r} needs the encoder's default "
                              "basis, but the statistics record no encoder; name the basis: "
                              f"{explicit}:<fingerprint>")
        return None
    try:
        return default_basis(enc.fingerprint())
    except ConfigError:
        if explicit is not None:
            raise
        return None


def project_arrays(meta: StatsMeta, arrays: dict[str, F64], counts: F64,
                   spec: ProjectionSpec) -> tuple[StatsMeta, dict[str, F64]]:
    """The noisy arrays of a release in the subspace of ``spec`` (P0s), with its metadata.

    ``sums`` (C, d) → (C, k); ``scatter`` (d, d) and each ``class_scatter`` (d, d) → (k, k);
    ``pooled`` mode's ``sq_sums`` (C, d) are rebuilt in the subspace as A_c²/N_c plus N_c times
    the pooled within-class variance of each coordinate (clamped at 0; the post-processing
    then rescales them to the denoised diagonal).

    Parameters
    ----------
    meta : StatsMeta
        Of the whole-space release (no projection).
    arrays : dict of str to ndarray
        The unpacked noisy float blocks.
    counts : ndarray, shape (C,)
        The clamped noisy counts (placeholders at 1).
    spec : ProjectionSpec
        ``pca-v1`` of input dimension d.
    """
    v = spec.matrix()
    out: dict[str, F64] = {}
    for name, arr in arrays.items():
        if name == "sums":
            out[name] = np.ascontiguousarray(arr @ v)
        elif name == "scatter":
            out[name] = np.ascontiguousarray(v.T @ arr @ v)
        elif name == "class_scatter":
            out[name] = np.ascontiguousarray(np.einsum("di,cde,ej->cij", v, arr, v,
                                                       optimize=True))
        elif name != "sq_sums":
            raise ConfigError(f"block {name!r} of mode {meta.mode!r} cannot be projected")
    if "sq_sums" in arrays:
        sums, n = out["sums"], np.maximum(counts, 1.0)
        between = (sums.T / n) @ sums
        dof = max(float(n.sum()) - meta.num_classes, 1.0)
        var = np.maximum(np.diagonal(out["scatter"] - between), 0.0) / dof
        out["sq_sums"] = sums**2 / n[:, None] + n[:, None] * var[None, :]
    return replace(meta, dim=spec.dim, projection=spec), out
