"""The default head of a model: the head ``predict`` and ``export`` use without ``--head``.

Chosen once, at fit time, by :data:`DEFAULT_HEAD_RULE`, and recorded in the manifest
(``default_head``, and ``default_head_rule``: the branch of the rule that decided, with its
figures):

1. When the upload carries a held-out section (clients computed their statistics with a holdout
   fraction), the head with the highest estimated held-out accuracy. Each head is fitted again
   on the fitting part of the statistics (total − held-out) and scored on Gaussian samples of
   the held-out part: per class c with n'_c held-out rows, min(n'_c, :data:`MAX_PER_CLASS`)
   draws from N(m'_c, Σ'), m'_c the held-out class mean and Σ' the held-out pooled covariance
   (its diagonal in ``diag`` mode; the fitting part's when the held-out part has no more rows
   than classes); class accuracies are weighted by n'_c. The draws are seeded by the job's
   seed. A head that cannot be fitted on the fitting part alone is left out of the comparison.
   Ties go to the earlier head of :data:`PREFERENCE`. This doubles the fitting time.
2. Otherwise ``lda`` when it was fitted.
3. Otherwise the first fitted head in :data:`PREFERENCE` (heads not listed there come after,
   in the order fitted).

Held-out scoring is skipped (rule 2 or 3 applies, and the recorded rule says why) for a
projected upload (the heads take the clients' unprojected features, the held-out moments are
projected) and for upload modes without second moments (``means``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import GhoflError
from ghofl.heads.base import Head
from ghofl.heads.build import build_heads
from ghofl.moments.core import Moments, compute_moments
from ghofl.stats.client_stats import ClientStats

__all__ = ["DEFAULT_HEAD_RULE", "MAX_PER_CLASS", "PREFERENCE", "choose_default_head",
           "heldout_accuracy"]

#: Order of preference among heads (rule 3, and ties of rule 1): discriminants with fitted
#: covariances first, the heads using the fewest statistics last.
PREFERENCE = ("lda", "qda", "fedcof", "fed3r", "ridge", "fishermix", "protohyper", "fedcgs",
              "ncm", "nb")
#: Gaussian draws per class at most when scoring on held-out statistics.
MAX_PER_CLASS = 500
#: The rule, as the card and ``--help`` state it.
DEFAULT_HEAD_RULE = (
    "the head with the best estimated accuracy on the clients' held-out statistics when the "
    "upload carries a holdout section (each head refitted without the held-out part); "
    "otherwise lda when fitted; otherwise the first fitted head in the order "
    + ", ".join(PREFERENCE))

F64 = NDArray[np.float64]


def _ordered(names: list[str]) -> list[str]:
    known = [n for n in PREFERENCE if n in names]
    return known + [n for n in names if n not in PREFERENCE]


def _fallback(names: list[str], why: str) -> tuple[str, str]:
    if "lda" in names:
        return "lda", f"lda is fitted ({why})"
    first = _ordered(names)[0]
    return first, f"first fitted head in the preference order {', '.join(PREFERENCE)} ({why})"


def _heldout_cov(held: Moments, fit: Moments) -> F64 | None:
    """Σ' (d, d) of the held-out rows (else of the fitting part); None without second moments."""
    for part in (held, fit):
        dof = part.n_samples - int(np.sum(part.counts > 0))
        if dof <= 0:
            continue
        if part.within_scatter is not None:
            out: F64 = part.within_scatter / dof
            return 0.5 * (out + out.T)
        if part.class_vars_ is not None:
            w = part.counts.astype(np.float64) @ part.class_vars_
            return np.diag(w / dof)
    return None


def heldout_accuracy(heads: Mapping[str, Head], held: Moments, cov: F64,
                     seed: int) -> dict[str, float]:
    """Accuracy of each head on Gaussian draws of the held-out classes.

    Parameters
    ----------
    heads : mapping of str to Head
        Heads fitted without the held-out part, on the held-out part's classes.
    held : Moments
        The held-out part: counts n'_c (C,) and means m'_c (C, d).
    cov : ndarray, shape (d, d)
        The covariance Σ' of the draws.
    seed : int
        Seeds the draws (the same draws for every head).

    Returns
    -------
    dict of str to float
        Per head, Σ_c n'_c·acc_c / Σ_c n'_c.
    """
    w, u = np.linalg.eigh(cov)
    root = u * np.sqrt(np.clip(w, 0.0, None))
    rng = np.random.default_rng(seed)
    xs, ys, weights = [], [], []
    for c in np.flatnonzero(held.counts > 0):
        k = int(min(held.counts[c], MAX_PER_CLASS))
        xs.append(held.means[c] + rng.standard_normal((k, cov.shape[0])) @ root.T)
        ys.append(np.full(k, c))
        weights.append(np.full(k, held.counts[c] / k))
    x, y, wt = np.vstack(xs), np.concatenate(ys), np.concatenate(weights)
    return {name: float(np.sum(wt * (np.argmax(h.class_scores(x), axis=1) == y)) / wt.sum())
            for name, h in heads.items()}


def choose_default_head(total: ClientStats, fitted: Mapping[str, Head],
                        params: Mapping[str, Mapping[str, Any]],
                        seed: int) -> tuple[str, str]:
    """``(head name, the rule's branch that chose it)`` for the fitted ``heads``.

    Parameters
    ----------
    total : ClientStats
        The statistics the heads were fitted from.
    fitted : mapping of str to Head
        The fitted heads (at least one).
    params : mapping
        The job's resolved hyperparameters, to refit the heads on the fitting part.
    seed : int
        The job's seed.
    """
    names = list(fitted)
    if total.holdout is None:
        return _fallback(names, "the upload has no held-out section")
    if total.meta.projection is not None:
        return _fallback(names, "held-out scoring does not apply to a projected upload")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parts = compute_moments(total).validation_split()
    cov = None if parts is None else _heldout_cov(parts[1], parts[0])
    if parts is None or cov is None:
        return _fallback(names, "the held-out section holds no second moments to score on")
    fit_part = total.fitting_part()
    refit: dict[str, Head] = {}
    fresh = build_heads(names, {k: dict(v) for k, v in params.items()}, seed=seed)
    for name, head in fresh.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                refit[name] = head.fit_from_stats(fit_part)
        except (GhoflError, ValueError, np.linalg.LinAlgError):
            continue  # e.g. a rule that needs the held-out section itself
    if not refit:
        return _fallback(names, "no head could be fitted without the held-out part")
    acc = heldout_accuracy(refit, parts[1], cov, seed)
    best = max(_ordered(list(acc)), key=lambda n: acc[n])  # max keeps the first of ties
    shown = ", ".join(f"{n} {acc[n]:.4f}" for n in _ordered(list(acc)))
    return best, f"best estimated accuracy on the clients' held-out statistics ({shown})"
