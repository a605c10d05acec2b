"""Personalisation with no extra communication: a client's own model from the global one.

A client holds the global model and its own statistics (the ``.ghs`` it uploaded); nothing
else is sent or received. From them it can change two things.

Priors (every head that scores with class priors: ``nb``, ``qda``, ``lda``, ``fedcgs``, and
``fishermix`` / ``protohyper`` fitted with ``prior_correction``). The global log prior
log π_c = log(N_c / N) of each head is replaced by the client's own,

    π̂_c = (n_c + λ) / Σ_k (n_k + λ),

over the classes the global model knows (N_k > 0), with n_c the client's count and λ the
pseudo-count (:data:`PRIOR_PSEUDOCOUNT`, 1: Laplace's rule, so a class the client has not
seen stays possible). Heads that store log priors get them replaced; ``lda`` and ``fedcgs``
store them inside their intercepts, which get log π̂_c − log π_c added (π from the model's
recorded counts). The result is exactly the head refitted from the global moments with the
client's priors (same means and covariances).

Moments (``--moments``; heads whose fitted arrays are the class Gaussians: ``nb``, ``qda``).
Each class Gaussian becomes the moment-matched Gaussian of the mixture
w_c·N(μ̂_c, Σ̂_c) + (1 − w_c)·N(μ_c, Σ_c) of the client's maximum-likelihood class Gaussian
and the global one, with the weight

    w_c = n_c / (n_c + κ)

(:data:`DEFAULT_KAPPA`: the global class Gaussian counts as κ samples of the client's). So
μ'_c = w μ̂_c + (1 − w) μ_c and Σ'_c = w Σ̂_c + (1 − w) Σ_c + w(1 − w)(μ̂_c − μ_c)(μ̂_c − μ_c)ᵀ
(diagonal for ``nb``). The rule uses only the client's counts, never its test data. ``qda``
needs the client's per-class second moments (``--mode full``), ``nb`` those of ``diag`` or
``full``. A head not covered keeps its global arrays, and :class:`Personalisation` says why.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import lapack

from ghofl.errors import ConfigError, InputError
from ghofl.heads.base import Head
from ghofl.heads.ood import MahalanobisOOD
from ghofl.model.directory import FittedModel, load_ood, save_model
from ghofl.model.fine_tune import DEFAULT_TAU, LINEAR_HEADS, fine_tune_heads
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.codec import load_stats
from ghofl.stats.meta import StatsMeta

__all__ = [
    "DEFAULT_KAPPA",
    "PRIOR_PSEUDOCOUNT",
    "Personalisation",
    "apply_prior_option",
    "local_priors",
    "personalize_heads",
    "save_personalized",
    "with_local_priors",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

#: λ of the client's prior (n_c + λ) / Σ (n_k + λ): Laplace's rule of succession.
PRIOR_PSEUDOCOUNT = 1.0
#: κ of the weight w_c = n_c / (n_c + κ) of the client's class Gaussian.
DEFAULT_KAPPA = 50.0
#: Heads whose log priors sit inside their intercepts.
_INTERCEPT_PRIORS = frozenset({"lda", "fedcgs"})
_MOMENT_HEADS = frozenset({"nb", "qda"})


@dataclass(frozen=True)
class Personalisation:
    """What :func:`personalize_heads` changed, and from what (recorded in the model).

    Attributes
    ----------
    priors, moments : bool
        Whether the priors and the class Gaussians were asked for.
    pseudocount, kappa : float
        λ of the prior and κ of the moment weight.
    local_counts : list of int
        The client's class counts n_c.
    heads : dict of str to list of str
        Per head, what was personalised (``"priors"``, ``"moments"``; empty: nothing).
    skipped : dict of str to str
        Per head and part not personalised, why.
    """

    priors: bool
    moments: bool
    pseudocount: float
    kappa: float
    local_counts: list[int]
    heads: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"priors": "local" if self.priors else "global", "moments": self.moments,
                "prior_pseudocount": self.pseudocount, "kappa": self.kappa,
                "kappa_rule": "w_c = n_c / (n_c + kappa)", "local_counts": self.local_counts,
                "local_samples": int(sum(self.local_counts)), "heads": self.heads,
                "skipped": self.skipped}


def local_priors(local_counts: NDArray[Any], global_counts: NDArray[Any],
                 pseudocount: float = PRIOR_PSEUDOCOUNT) -> F64:
    """The client's priors (n_c + λ) / Σ_k (n_k + λ) over the classes with N_k > 0.

    Parameters
    ----------
    local_counts, global_counts : array_like of int, shape (C,)
    pseudocount : float, default :data:`PRIOR_PSEUDOCOUNT`

    Returns
    -------
    ndarray, shape (C,)
        Sums to 1; 0 for a class the global model does not know.
    """
    if not (math.isfinite(pseudocount) and pseudocount >= 0):
        raise ConfigError(f"the prior pseudo-count must be a finite number >= 0; got "
                          f"{pseudocount!r}")
    n = np.asarray(local_counts, dtype=np.float64)
    known = np.asarray(global_counts) > 0
    w = np.where(known, n + pseudocount, 0.0)
    if w.sum() <= 0:
        raise InputError("the client's statistics hold no sample of any class the model knows "
                         "and the pseudo-count is 0; give a pseudo-count > 0 or the client's "
                         "own statistics")
    out: F64 = w / w.sum()
    return out


def _log(p: F64) -> F64:
    with np.errstate(divide="ignore"):
        out: F64 = np.log(p)
    return out


def _put(arrays: dict[str, F64], name: str, value: F64) -> None:
    arrays[name] = np.ascontiguousarray(value, dtype=np.float64)


def _shift_priors(head: Head, arrays: dict[str, F64], log_local: F64,
                  log_global: F64) -> str | None:
    """Put the client's log priors into ``arrays`` of ``head``; the reason when it has none."""
    if head.get_params().get("prior_correction", True) is False:
        return "trained with uniform priors (prior_correction=False)"
    if "log_priors_" in arrays:
        old = np.asarray(arrays["log_priors_"])
        _put(arrays, "log_priors_", np.where(np.isfinite(old), log_local, old))
        return None
    if head.name in _INTERCEPT_PRIORS:
        old = np.asarray(arrays["intercept_"])
        keep = np.isfinite(old) & np.isfinite(log_global)
        shift = np.where(keep, log_local - np.where(keep, log_global, 0.0), 0.0)
        _put(arrays, "intercept_", np.where(keep, old + shift, old))
        return None
    return "the head scores without class priors"


def _local_gaussians(stats: ClientStats, diagonal: bool) -> tuple[F64, F64] | None:
    """The client's ML class means (C, d) and (co)variances ((C, d) or (C, d, d)), if held."""
    n = np.maximum(stats.counts, 1).astype(np.float64)
    mu = stats.sums / n[:, None]
    if diagonal:
        if stats.sq_sums is not None:
            second = stats.sq_sums / n[:, None]
        elif stats.class_scatter is not None:
            second = np.einsum("cii->ci", stats.class_scatter) / n[:, None]
        else:
            return None
        return mu, np.maximum(second - mu**2, 0.0)
    if stats.class_scatter is None:
        return None
    cov = stats.class_scatter / n[:, None, None] - np.einsum("ci,cj->cij", mu, mu)
    return mu, 0.5 * (cov + np.transpose(cov, (0, 2, 1)))


def _inverse(m: F64, *, lower: bool, triangular: bool = False) -> F64:
    """The inverse of a (d, d) matrix ``m`` (triangular inverse when it is triangular).

    LAPACK's triangular inverse when ``m`` is triangular on the stated side (``triangular``:
    known to be, unchecked), else a general inverse.
    """
    if triangular or not np.any(np.triu(m, 1) if lower else np.tril(m, -1)):
        inv, info = lapack.dtrtri(m, lower=int(lower))
        if info == 0:
            out: F64 = np.tril(inv) if lower else np.triu(inv)
            return out
    general: F64 = np.asarray(np.linalg.inv(m), dtype=np.float64)
    return general


def _global_cov(prec: F64, c: int, covs: dict[int, F64]) -> F64:
    """Σ_c = P_c⁻ᵀ P_c⁻¹ of QDA's ``precision_chol_`` P (C, d, d), kept in ``covs``."""
    if c not in covs:
        p_inv = _inverse(prec[c], lower=False)  # P = L⁻ᵀ, so Σ = P⁻ᵀ P⁻¹
        covs[c] = p_inv.T @ p_inv
    return covs[c]


def _mix_moments(head: Head, arrays: dict[str, F64], local: ClientStats,
                 kappa: float, covs: dict[int, F64]) -> str | None:
    """The client-weighted class Gaussians into ``arrays`` of ``head``; why not, if not.

    ``covs``: the global class covariances of a ``qda`` head computed so far (class -> (d, d)),
    filled as they are needed.
    """
    if head.name not in _MOMENT_HEADS:
        return "its fitted arrays do not hold the class Gaussians (nb and qda do)"
    diagonal = head.name == "nb"
    loc = _local_gaussians(local, diagonal)
    if loc is None:
        need = "diag or full" if diagonal else "full"
        return (f"the client's statistics (mode {local.meta.mode!r}) hold no per-class second "
                f"moments; recompute them with --mode {need.split()[-1]}")
    mu_l, var_l = loc
    counts = local.counts.astype(np.float64)
    w = counts / (counts + kappa)
    mu_g = np.asarray(arrays["means_"])
    delta = mu_l - mu_g
    _put(arrays, "means_", w[:, None] * mu_l + (1 - w[:, None]) * mu_g)
    if diagonal:
        v_g = np.asarray(arrays["vars_"])
        _put(arrays, "vars_", w[:, None] * var_l + (1 - w[:, None]) * v_g
             + (w * (1 - w))[:, None] * delta**2)
        return None
    prec = np.array(arrays["precision_chol_"])
    half = np.array(arrays["half_log_det_"])
    for c in np.flatnonzero(w > 0):
        cov = (w[c] * var_l[c] + (1 - w[c]) * _global_cov(prec, int(c), covs)
               + w[c] * (1 - w[c]) * np.outer(delta[c], delta[c]))
        chol = np.linalg.cholesky(0.5 * (cov + cov.T))
        prec[c] = _inverse(chol, lower=True, triangular=True).T
        half[c] = float(np.sum(np.log(np.diag(chol))))
    _put(arrays, "precision_chol_", prec)
    _put(arrays, "half_log_det_", half)
    return None


def _check_local(local: ClientStats, meta: StatsMeta) -> None:
    lm = local.meta
    if tuple(lm.classes) != tuple(meta.classes):
        raise InputError(
            f"the client's statistics have {len(lm.classes)} classes "
            f"({', '.join(lm.classes[:5])}{', ...' if len(lm.classes) > 5 else ''}), not the "
            "model's; give the statistics this client computed for the federation of this model"
        )
    enc_l, enc_m = lm.encoder, meta.encoder
    same_encoder = enc_l is None or enc_m is None or enc_l.fingerprint() == enc_m.fingerprint()
    if lm.dim != meta.dim or lm.projection != meta.projection or not same_encoder:
        raise InputError(
            f"the client's statistics (d={lm.dim}) were not computed in the model's statistics "
            f"space (d={meta.dim}, same encoder, transform and projection); give the statistics "
            "this client computed for the federation of this model"
        )


def personalize_heads(heads: Mapping[str, Head], global_counts: NDArray[Any],
                      local: ClientStats, *, priors: bool = True, moments: bool = False,
                      kappa: float = DEFAULT_KAPPA,
                      pseudocount: float = PRIOR_PSEUDOCOUNT,
                      cache: dict[str, Any] | None = None
                      ) -> tuple[dict[str, Head], Personalisation]:
    """Copies of the global ``heads`` with the client's priors and/or class Gaussians.

    Parameters
    ----------
    heads : mapping of str to Head
        The fitted global heads (left unchanged).
    global_counts : array_like of int, shape (C,)
        N_c of the statistics the heads were fitted from (the model's ``stats.counts``).
    local : ClientStats
        The client's own statistics, in the heads' statistics space.
    priors, moments : bool
        What to personalise (module docstring).
    kappa : float, default :data:`DEFAULT_KAPPA`
    pseudocount : float, default :data:`PRIOR_PSEUDOCOUNT`
    cache : dict, optional
        Keeps the global class covariances of ``qda`` heads between calls on the same global
        ``heads`` (many clients personalised from one model, as a benchmark does); a client
        personalising once needs none.

    Returns
    -------
    heads : dict of str to Head
    record : Personalisation

    Raises
    ------
    ConfigError
        Nothing asked for, or κ or λ out of range.
    InputError
        The client's statistics do not match the heads.
    """
    if not (priors or moments):
        raise ConfigError("nothing to personalise: ask for the local priors, the moments or "
                          "both (--prior local and/or --moments)")
    if not (math.isfinite(kappa) and kappa > 0):
        raise ConfigError(f"kappa must be a finite number > 0; got {kappa!r}")
    if not heads:
        raise ConfigError("personalisation needs at least one fitted head; got none")
    meta = next(iter(heads.values())).meta_
    _check_local(local, meta)
    g = np.asarray(global_counts, dtype=np.float64)
    if g.shape != (meta.num_classes,) or not np.all(g >= 0) or g.sum() <= 0:
        raise InputError(f"the model's class counts must be {meta.num_classes} numbers >= 0, "
                         "not all 0; the model records none usable, fit it with `ghofl fit`")
    log_local = _log(local_priors(local.counts, g, pseudocount))
    log_global = _log(g / g.sum())
    record = Personalisation(priors, moments, float(pseudocount), float(kappa),
                             [int(v) for v in local.counts])
    out: dict[str, Head] = {}
    for name, head in heads.items():
        arrays, scalars = head.get_state()
        arrays = {k: np.array(v) for k, v in arrays.items()}
        reasons = {"priors": _shift_priors(head, arrays, log_local, log_global)
                   if priors else "", "moments": _mix_moments(
                       head, arrays, local, kappa,
                       ({} if cache is None else cache).setdefault(f"{name}:{id(head)}", {}))
                   if moments else ""}
        done = [part for part, why in reasons.items() if why is None]
        record.skipped.update({f"{name}/{part}": why for part, why in reasons.items() if why})
        record.heads[name] = done
        mine = copy.deepcopy(head)
        out[name] = mine.set_state(head.meta_, arrays, scalars)
    return out, record


def _global_counts(model: FittedModel, model_dir: Path) -> I64:
    """N_c (C,) the global model records; refused for a personalised model or none recorded."""
    if "personalised" in model.manifest:
        raise InputError(f"the model in '{model_dir}' is already personalised; personalise "
                         "the global model (the one `ghofl fit` wrote) instead")
    counts = model.manifest.get("stats", {}).get("counts")
    if counts is None:
        raise InputError(f"the model in '{model_dir}' records no class counts, so its global "
                         "priors are unknown; fit it again with `ghofl fit`")
    out: I64 = np.asarray(counts, dtype=np.int64)
    return out


def with_local_priors(model: FittedModel, head_name: str, local: ClientStats,
                      model_dir: Path, pseudocount: float = PRIOR_PSEUDOCOUNT) -> FittedModel:
    """``model`` whose head ``head_name`` predicts with the client's priors (``--prior local``).

    The head is :func:`personalize_heads` with ``priors=True`` alone: log π_c becomes
    log π̂_c = log((n_c + λ) / Σ_k (n_k + λ)) of the client's counts n_c, λ =
    ``pseudocount`` (with λ > 0 a class the client has not seen keeps a finite prior
    λ / Σ_k (n_k + λ); with λ = 0 it gets prior 0 and is never predicted); its means and
    covariances stay the global ones. Nothing is written.

    Parameters
    ----------
    model : FittedModel
        The global model.
    head_name : str
        The head that predicts.
    local : ClientStats
        The client's own statistics (its class counts are what is used).
    model_dir : Path
        Where ``model`` was read from, for messages.
    pseudocount : float, default :data:`PRIOR_PSEUDOCOUNT`
        λ; 0 gives the classes the client never held prior 0 (never predicted).

    Returns
    -------
    FittedModel
        ``model`` with that one head replaced (the manifest unchanged).

    Raises
    ------
    InputError
        The model is personalised already or records no class counts, or ``local`` is not in
        its statistics space (other classes, encoder, dimension or projection).
    ConfigError
        The head scores without class priors.
    """
    heads, record = personalize_heads({head_name: model.head(head_name)},
                                      _global_counts(model, model_dir), local, priors=True,
                                      pseudocount=pseudocount)
    why = record.skipped.get(f"{head_name}/priors")
    if why:
        raise ConfigError(f"--prior local cannot change head {head_name!r}: {why}; choose a "
                          "head that scores with class priors (lda, qda, nb, fedcgs) with "
                          "--head, or drop --prior local")
    return model._replace(heads={**model.heads, head_name: heads[head_name]})


def apply_prior_option(model: FittedModel, head_name: str, prior: str, stats: Path | None,
                       model_dir: Path, pseudocount: float | None = None) -> FittedModel:
    """``ghofl predict --prior {global,local} [--stats CLIENT.ghs]``: the model to predict with.

    Parameters
    ----------
    model : FittedModel
    head_name : str
        The head that predicts.
    prior : str
        ``"global"``: ``model`` as it is; ``"local"``: :func:`with_local_priors` with the
        class counts of ``stats``.
    stats : Path or None
        The client's own statistics file (``.ghs``, as it uploaded it); only with ``local``.
    model_dir : Path
        Where ``model`` was read from, for messages.
    pseudocount : float, optional
        λ of the local priors (``--prior-pseudocount``; default :data:`PRIOR_PSEUDOCOUNT`;
        0: classes the client never held are never predicted); only with ``local``.

    Returns
    -------
    FittedModel

    Raises
    ------
    ConfigError
        ``prior`` is neither, ``--stats`` is missing for ``local`` or given for ``global``,
        ``pseudocount`` is given for ``global`` or is negative (:func:`local_priors`), or the
        head scores without class priors.
    InputError
        As :func:`with_local_priors`.
    StatsFormatError, StatsValidationError
        ``stats`` is no statistics file, or holds invalid statistics
        (:func:`~ghofl.stats.load_stats`).
    """
    if prior not in ("global", "local"):
        raise ConfigError(f"--prior must be 'global' or 'local'; got {prior!r}")
    if prior == "global":
        if stats is not None:
            raise ConfigError("--stats gives the client's class counts for --prior local; add "
                              "--prior local or drop --stats")
        if pseudocount is not None:
            raise ConfigError("--prior-pseudocount sets λ of the local priors; add --prior "
                              "local or drop --prior-pseudocount")
        return model
    if stats is None:
        raise ConfigError("--prior local needs this client's class counts: give --stats "
                          "client.ghs (the statistics file it computed and uploaded)")
    lam = PRIOR_PSEUDOCOUNT if pseudocount is None else float(pseudocount)
    return with_local_priors(model, head_name, load_stats(stats), model_dir, lam)


def save_personalized(out_dir: Path, model: FittedModel, model_dir: Path, local: ClientStats,
                      stats_source: str, **options: Any) -> tuple[Path, Personalisation]:
    """Personalise ``model`` with the client's ``local`` statistics and write a model directory.

    Parameters
    ----------
    out_dir : Path
        The new model directory (written by :func:`~ghofl.model.directory.save_model`).
    model : FittedModel
        The global model, loaded from ``model_dir``.
    model_dir : Path
    local : ClientStats
    stats_source : str
        Where ``local`` was read from, recorded in the manifest.
    **options
        ``priors``, ``moments``, ``kappa``, ``pseudocount`` of :func:`personalize_heads`;
        ``fine_tune``: ``(z (n, d), y (n,), source)``, the client's rows in the heads' input
        space, their class indices and where they were read from: the linear heads are then
        :func:`~ghofl.model.fine_tune.fine_tune_heads` of the global ones (``tau``), the
        other heads personalised as asked.

    Returns
    -------
    out_dir : Path
    record : Personalisation
        Also in the manifest under ``personalised`` (with ``from_model`` and ``from_stats``).

    Raises
    ------
    InputError
        The model is itself personalised, or records no class counts.
    """
    manifest = model.manifest
    rows = options.pop("fine_tune", None)
    tau = options.pop("tau", DEFAULT_TAU)
    counts = _global_counts(model, model_dir)
    heads, record = personalize_heads(model.heads, counts, local, **options)
    tuned: dict[str, Any] = {}
    if rows is not None:
        z, y, source = rows
        linear = {n: h for n, h in model.heads.items() if h.name in LINEAR_HEADS}
        if not linear:
            raise ConfigError("--embeddings fine-tunes the linear heads (lda, fedcgs) and the "
                              f"model in '{model_dir}' has none; fit it with --heads lda")
        new, ft = fine_tune_heads(linear, counts, z, y, tau=tau)
        heads.update(new)
        for n in new:
            record.heads[n] = [*record.heads.get(n, []), "fine-tuned"]
        tuned = {"fine_tune": {**ft.to_dict(), "from_embeddings": source}}
    meta = next(iter(heads.values())).meta_
    ood: MahalanobisOOD | None = load_ood(model_dir, manifest)
    extra = {"stats": dict(manifest["stats"]),
             "personalised": {**record.to_dict(), **tuned, "from_model": str(model_dir),
                              "from_model_digest": manifest.get("digest"),
                              "from_stats": stats_source}}
    for key in ("default_head", "default_head_rule", "license"):  # the global model's choices
        if key in manifest:
            extra[key] = manifest[key]
    fit_seconds = {n: e.get("fit_seconds", 0.0) for n, e in manifest["heads"].items()}
    save_model(out_dir, heads, stats_meta=meta, extra=extra, fit_seconds=fit_seconds,
               option="--out", ood=ood)
    return out_dir, record
