"""A public within-class covariance as a prior for a private release (P3p): no budget.

After the pooled within-class covariance of a ``pooled`` or ``gram`` release has been denoised
(P3n, :func:`ghofl.privacy.postprocess.denoise_covariance`), its eigenvalues are estimates of
the noiseless variance along each eigenvector, but the eigenvectors themselves are those of the
noisy matrix: where the noise swamps the spectrum they point in directions the data does not
favour. The within-class covariance of the same encoder on a *public* labelled dataset (never
the federation's data) knows which directions carry within-class variance. The server mixes
the two,

    P̂ = (1 − b)·R + b·s·T,

R the denoised covariance, T the public one, s = tr P̃ / tr T (the release's total variance),
with the weight b that minimises an estimate of the Frobenius error ‖P̂ − P‖² (P the noiseless
covariance). The error is a quadratic in b whose minimum is

    b* = s·⟨T, P − R⟩ / ‖R − s·T‖²,

a closed form that needs ⟨R, P − R⟩ = 0 (the property that defines the denoised eigenvalues:
ξ_i = v_iᵀ P v_i, so the residual P − R has no component along any v_i v_iᵀ) and ⟨T, P⟩, which
⟨T, P̃⟩ estimates without bias (the noise has mean 0 and T does not depend on it). So b* is
large when the denoised estimate misses variance along the directions the public covariance
favours, and 0 without noise (R = P̃). It is clipped to [0, 1]; P̂ stays positive definite (a
convex combination of two). Everything it reads is the release and public values: the mix is
post-processing and spends no budget.

What it changes is measured with seeds in BENCHMARKS.md "Differential privacy beside outside
anchors" (CIFAR-10 with a covariance from Tiny-ImageNet, TREC with one from SST-2 and AG News),
beside the same runs without it.

Files
-----
A public covariance is ``<fingerprint>.cov.npy`` (float32, shape (d, d), symmetric), the
fingerprint being the first 16 hex digits of the SHA-256 of the file, in the folders of
:func:`ghofl.stats.projection.basis_dirs` (``$GHOFL_PROJECTION_DIR``, then
``~/.cache/ghofl/projections``); ``<encoder fingerprint>.cov.json`` there names an encoder's
default (written by :func:`save_prior` with ``default_for``; ``ghofl covariance-prior`` does
both). The server alone reads it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.stats.meta import StatsMeta
from ghofl.stats.projection import (
    basis_dirs,
    file_fingerprint,
    float32_npy,
    is_fingerprint,
    read_public_file,
    recorded_default,
)

__all__ = [
    "PRIOR_USAGE",
    "PriorChoice",
    "PriorMix",
    "check_prior_option",
    "choose_prior",
    "default_prior",
    "load_prior",
    "mix_prior",
    "named_prior",
    "prior_fingerprint",
    "prior_weight",
    "save_prior",
    "within_covariance",
]

PRIOR_USAGE = "expected auto, auto:<covariance fingerprint> or none"

F64 = NDArray[np.float64]
_SUFFIX = ".cov.npy"
_DEFAULT_SUFFIX = ".cov.json"


# ---------------------------------------------------------------------- the artefact
def within_covariance(x: NDArray[Any], y: NDArray[Any], clip_norm: float | None = None) -> F64:
    """Pooled within-class covariance of public labelled features (divisor N − C).

    Parameters
    ----------
    x : ndarray, shape (n, d)
        Encoder features of a PUBLIC labelled dataset (never the federation's data).
    y : ndarray of int, shape (n,)
        Their class labels (any non-negative integers; the classes need not be the
        federation's).
    clip_norm : float, optional
        Clip each row to this L2 norm first, as the federation's clients do (their R).

    Returns
    -------
    ndarray, shape (d, d), symmetric positive semi-definite.

    Raises
    ------
    ConfigError
        Not a finite 2-D array with one non-negative integer label per row, or no more rows
        than classes.
    """
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y)
    if xa.ndim != 2 or ya.shape != (xa.shape[0],):
        raise ConfigError(f"a public covariance needs features (n, d) and one label per row; "
                          f"got shapes {xa.shape} and {ya.shape}")
    if not np.all(np.isfinite(xa)):
        raise ConfigError("the public features contain NaN or infinite values; clean them first")
    if ya.dtype.kind not in "iu" or (ya.size and int(ya.min()) < 0):
        raise ConfigError("the public labels must be non-negative integers (class indices)")
    if clip_norm is not None:
        if not clip_norm > 0.0:
            raise ConfigError(f"the clipping bound must be positive; got {clip_norm}")
        norms = np.linalg.norm(xa, axis=1, keepdims=True)
        xa = xa * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))
    labels, inverse = np.unique(ya, return_inverse=True)
    n, c = xa.shape[0], labels.shape[0]
    if n <= c:
        raise ConfigError(f"a within-class covariance needs more rows than classes; got {n} "
                          f"rows of {c} classes")
    sums = np.zeros((c, xa.shape[1]))
    np.add.at(sums, inverse, xa)
    counts = np.bincount(inverse, minlength=c).astype(np.float64)
    scatter = xa.T @ xa - (sums.T / counts) @ sums
    out: F64 = 0.5 * (scatter + scatter.T) / (n - c)
    return out


def prior_fingerprint(cov: NDArray[Any]) -> str:
    """First 16 hex digits of the SHA-256 of the covariance as a float32 ``.npy`` file."""
    return file_fingerprint(float32_npy(cov))


def save_prior(cov: NDArray[Any], directory: str | os.PathLike[str] | None = None, *,
               default_for: str | None = None, source: str = "") -> tuple[Path, str]:
    """Write a public covariance as ``<fingerprint>.cov.npy``; return (path, fingerprint).

    Parameters
    ----------
    cov : ndarray, shape (d, d)
        From :func:`within_covariance` (stored as float32).
    directory : path, optional
        Target folder (default: the first of :func:`~ghofl.stats.projection.basis_dirs`).
    default_for : str, optional
        An encoder fingerprint: also write ``<default_for>.cov.json`` naming this covariance
        as that encoder's default (``--dp-prior auto``).
    source : str
        Free text recorded in that JSON (the public dataset and sample count).

    Raises
    ------
    ConfigError
        Not a finite symmetric (d, d) array.
    """
    c32 = np.asarray(cov, dtype=np.float32)
    if c32.ndim != 2 or c32.shape[0] != c32.shape[1] or not np.all(np.isfinite(c32)):
        raise ConfigError(f"a public covariance must be a finite square array (d, d); got "
                          f"shape {c32.shape}")
    if not np.array_equal(c32, c32.T):
        raise ConfigError("a public covariance must be symmetric; symmetrise it (0.5*(C + C.T))")
    folder = Path(directory) if directory is not None else basis_dirs()[0]
    folder.mkdir(parents=True, exist_ok=True)
    blob = float32_npy(c32)
    fp = file_fingerprint(blob)
    path = folder / f"{fp}{_SUFFIX}"
    tmp = folder / f"{fp}{_SUFFIX}.tmp"
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    if default_for is not None:
        info = {"covariance": fp, "dim": int(c32.shape[0]), "source": source}
        (folder / f"{default_for}{_DEFAULT_SUFFIX}").write_text(json.dumps(info, indent=1) + "\n")
    return path, fp


def load_prior(fingerprint: str) -> F64:
    """The public covariance ``<fingerprint>.cov.npy``, its digest checked.

    Returns
    -------
    ndarray of float64, shape (d, d), read-only.

    Raises
    ------
    ConfigError
        No such file, or its content does not hash to ``fingerprint`` or is not a finite
        symmetric square array.
    """
    return _load_cached(fingerprint, tuple(str(p) for p in basis_dirs()))


@lru_cache(maxsize=4)
def _load_cached(fingerprint: str, dirs: tuple[str, ...]) -> F64:
    again = "build it again with ghofl covariance-prior"
    arr = read_public_file(fingerprint, _SUFFIX, dirs, "public covariance file", again)
    if arr is None:
        raise ConfigError(f"no public covariance with fingerprint {fingerprint} in "
                          f"{', '.join(dirs)}; copy {fingerprint}{_SUFFIX} there (or set "
                          "$GHOFL_PROJECTION_DIR), or build one with ghofl covariance-prior")
    if (arr.ndim != 2 or arr.shape[0] != arr.shape[1] or not np.all(np.isfinite(arr))
            or not np.array_equal(arr, arr.T)):
        raise ConfigError(f"public covariance {fingerprint}{_SUFFIX} is not a finite "
                          f"symmetric square array; {again}")
    return arr


def default_prior(encoder_fingerprint: str) -> str | None:
    """Fingerprint of the public covariance recorded for an encoder, or None.

    Raises
    ------
    ConfigError
        The record exists but is malformed.
    """
    return recorded_default(encoder_fingerprint, _DEFAULT_SUFFIX, "covariance",
                            "ghofl covariance-prior")


# ---------------------------------------------------------------------- the option
def check_prior_option(text: str) -> str:
    """The option's text, checked for form only (the file is looked up at release time).

    Raises
    ------
    ConfigError
        Not one of the forms of :data:`PRIOR_USAGE`.
    """
    if not isinstance(text, str):
        raise ConfigError(f"the DP prior must be a string; got {text!r}; {PRIOR_USAGE}")
    parts = text.strip().split(":")
    ok = parts in (["auto"], ["none"]) or (
        len(parts) == 2 and parts[0] == "auto" and is_fingerprint(parts[1]))
    if not ok:
        raise ConfigError(f"invalid DP prior {text!r}; {PRIOR_USAGE}")
    return text.strip()


def named_prior(text: str) -> str | None:
    """The fingerprint of the covariance a (checked) prior option names, or None.

    ``auto:<fp>`` names one; ``auto`` (the encoder's default, looked up at release time) and
    ``none`` do not.
    """
    parts = text.split(":")
    return parts[1] if len(parts) == 2 else None


@dataclass(frozen=True)
class PriorChoice:
    """The public covariance a release is mixed with, in the release's coordinates.

    Attributes
    ----------
    target : ndarray, shape (k, k), or None
        T (None: no prior).
    fingerprint : str or None
        The file's fingerprint.
    reason : str
        Why there is none, when there is none (recorded among the release's notes).
    """

    target: F64 | None
    fingerprint: str | None
    reason: str


def choose_prior(option: str, meta: StatsMeta) -> PriorChoice:
    """The public covariance for a release of metadata ``meta`` (public values only).

    ``auto`` takes the default of the encoder the statistics record (none known: no prior);
    ``auto:<fp>`` that file; ``none`` no prior. When the statistics are in a projected space
    (the clients' projection, or the server's DP subspace), T is projected with it:
    MᵀTM, M the projection matrix (d_in, k).

    Raises
    ------
    ConfigError
        The file named is missing or corrupt, or its dimension is not the encoder's.
    """
    text = check_prior_option(option)
    if text == "none":
        return PriorChoice(None, None, "no public covariance prior (DP prior: none)")
    fp = named_prior(text)
    if fp is None and meta.encoder is None:
        return PriorChoice(None, None, "no public covariance prior: the statistics record no "
                           "encoder (name one: --dp-prior auto:<fingerprint>)")
    if fp is None:
        assert meta.encoder is not None
        fp = default_prior(meta.encoder.fingerprint())
        if fp is None:
            return PriorChoice(None, None, (
                "no public covariance prior: none is recorded for the encoder (build one "
                "with ghofl covariance-prior from public labelled embeddings)"))
    cov = load_prior(fp)
    proj = meta.projection
    d_in = meta.dim if proj is None else proj.input_dim
    if cov.shape[0] != d_in:
        raise ConfigError(f"public covariance {fp} is {cov.shape[0]}-dimensional but the "
                          f"statistics' encoder space has d={d_in}; use the covariance built "
                          "for this encoder")
    if proj is not None:
        m = proj.matrix()
        cov = m.T @ cov @ m
    return PriorChoice(np.asarray(0.5 * (cov + cov.T)), fp, "")


# ---------------------------------------------------------------------- the mix
@dataclass(frozen=True)
class PriorMix:
    """The mixed covariance and its weight.

    Attributes
    ----------
    cov : ndarray, shape (k, k)
        P̂ = (1 − b)·R + b·s·T.
    weight : float
        b, in [0, 1].
    scale : float
        s = tr P̃ / tr T.
    """

    cov: F64
    weight: float
    scale: float


def prior_weight(noisy: F64, denoised: F64, target: F64) -> tuple[float, float]:
    """(b*, s): the weight of the public covariance that minimises the estimated error.

    b* = s·⟨T, P̃ − R⟩ / ‖R − s·T‖² clipped to [0, 1], s = tr P̃ / tr T (see the module
    docstring).

    Parameters
    ----------
    noisy : ndarray, shape (k, k)
        P̃, the noisy covariance (its noise of mean 0).
    denoised : ndarray, shape (k, k)
        R, its denoised estimate (:func:`~ghofl.privacy.postprocess.denoise_covariance`).
    target : ndarray, shape (k, k)
        T, the public covariance.
    """
    tr_t = float(np.trace(target))
    if tr_t <= 0.0:
        return 0.0, 0.0
    s = max(float(np.trace(noisy)), 0.0) / tr_t
    diff = denoised - s * target
    den = float(np.vdot(diff, diff))
    num = s * float(np.vdot(target, noisy - denoised))
    if den <= 0.0 or not np.isfinite(num / den):
        return 0.0, s
    return float(min(max(num / den, 0.0), 1.0)), s


def mix_prior(noisy: F64, denoised: F64, target: F64) -> PriorMix:
    """P̂ = (1 − b*)·R + b*·s·T (:func:`prior_weight`)."""
    b, s = prior_weight(noisy, denoised, target)
    out = denoised if b == 0.0 else (1.0 - b) * denoised + (b * s) * target
    return PriorMix(np.asarray(0.5 * (out + out.T)), b, s)
