"""Centralised reference rows on the same features: the ceiling one-shot heads are measured against.

* ``logreg``: multinomial logistic regression on standardised real embeddings, inverse
  regularisation C chosen by stratified k-fold cross-validation on the TRAIN split only
  (on a stratified subsample of at most ``cv_max_samples`` rows to bound its cost), then refit
  on the whole train split. The objective is scikit-learn's ``LogisticRegression``; the solver
  is :class:`ghofl.bench.logreg.LogisticProbe` (the same L-BFGS-B, float32 products with the
  data matrix, warm-started C path), fast enough for C = 200 classes.
* ``sklearn_lda``: scikit-learn ``LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto")``
  (Ledoit–Wolf) on the pooled real embeddings.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import require_extra
from ghofl.stats.codec import atomic_write

#: the logistic-regression solver, part of the ``logreg`` cache key
SOLVER = "lbfgs-f32products-warmpath-v2"


@dataclass
class ReferenceResult:
    """A centralised reference's test accuracy, fit time and details (JSON-cached)."""

    name: str
    accuracy: float
    fit_seconds: float
    details: dict[str, Any] = field(default_factory=dict)


def logreg_reference(
    x_train: NDArray[Any],
    y_train: NDArray[Any],
    x_test: NDArray[Any],
    y_test: NDArray[Any],
    cs: tuple[float, ...] = (1e-3, 3e-3, 1e-2, 3e-2),
    folds: int = 3,
    cv_max_samples: int = 10_000,
    seed: int = 0,
    max_iter: int = 500,
) -> ReferenceResult:
    """Centralised logistic-regression probe with C chosen by CV on train only.

    A single value in ``cs`` is used as is, without cross-validation.
    """
    t0 = time.perf_counter()
    final, details = fit_logreg_probe(
        x_train, y_train, cs=cs, folds=folds, cv_max_samples=cv_max_samples, seed=seed,
        max_iter=max_iter,
    )
    acc = float(np.mean(final.predict(x_test) == y_test))
    return ReferenceResult("logreg", acc, time.perf_counter() - t0, details)


def fit_logreg_probe(
    x_train: NDArray[Any],
    y_train: NDArray[Any],
    cs: tuple[float, ...] = (1e-3, 3e-3, 1e-2, 3e-2),
    folds: int = 3,
    cv_max_samples: int = 10_000,
    seed: int = 0,
    max_iter: int = 500,
) -> tuple[Any, dict[str, Any]]:
    """The fitted probe of :func:`logreg_reference` and its details.

    The probe is a scikit-learn pipeline with ``predict``; the details are the chosen C, CV scores
    and solver iterations. One fit can score several test sets.

    The pipeline is ``StandardScaler`` then :class:`~ghofl.bench.logreg.LogisticProbe`:
    scikit-learn's ``LogisticRegression(C)`` objective and L-BFGS-B solver (tolerance 1e-4,
    ``max_iter``) with float32 products with the data matrix. Cross-validation uses the same
    stratified folds as ``cross_val_score`` with the scaler fitted on each training fold; in
    each fold the grid is solved in increasing C, warm-started (:func:`~ghofl.bench.logreg.
    fit_path`). The refit on the whole train split starts from the mean of the fold solutions
    at the chosen C.
    """
    require_extra("sklearn", "bench")
    from sklearn.model_selection import StratifiedKFold, train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from ghofl.bench.logreg import LogisticProbe, fit_path

    xs, ys = x_train, y_train
    if len(y_train) > cv_max_samples:
        xs, _, ys, _ = train_test_split(
            x_train, y_train, train_size=cv_max_samples, stratify=y_train, random_state=seed
        )
    scores: dict[float, float] = {}
    cv_iters: dict[float, int] = {}
    fold_fits: dict[float, list[LogisticProbe]] = {}
    if len(cs) > 1:  # one C: nothing to choose
        cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        per_fold: dict[float, list[float]] = {float(c): [] for c in cs}
        for tr, te in cv.split(xs, ys):
            scaler = StandardScaler().fit(xs[tr])
            path = fit_path(scaler.transform(xs[tr]), ys[tr], cs, max_iter=max_iter)
            x_te = scaler.transform(xs[te])
            for c, probe in path.items():
                per_fold[c].append(probe.score(x_te, ys[te]))
                cv_iters[c] = cv_iters.get(c, 0) + probe.n_iter_
                fold_fits.setdefault(c, []).append(probe)
        scores = {c: float(np.mean(v)) for c, v in per_fold.items()}
    best = max(scores, key=lambda k: scores[k]) if scores else float(cs[0])
    probe = LogisticProbe(C=best, max_iter=max_iter, warm_start=True)
    start = fold_fits.get(best, [])
    if start and all(np.array_equal(p.classes_, start[0].classes_) for p in start):
        probe.coef_ = np.mean([p.coef_ for p in start], axis=0)
        probe.intercept_ = np.mean([p.intercept_ for p in start], axis=0)
    final = make_pipeline(StandardScaler(), probe)
    final.fit(x_train, y_train)
    return final, {
        "C": best,
        "cv_scores": {str(k): v for k, v in scores.items()},
        "cv_samples": len(ys) if scores else 0,
        "folds": folds if scores else 0,
        "solver": SOLVER,
        "n_iter": probe.n_iter_,
        "converged": probe.converged_,
        "cv_iters": {str(k): v for k, v in cv_iters.items()},
    }


def sklearn_lda_reference(
    x_train: NDArray[Any],
    y_train: NDArray[Any],
    x_test: NDArray[Any],
    y_test: NDArray[Any],
) -> ReferenceResult:
    """Centralised scikit-learn LDA with Ledoit–Wolf shrinkage on the pooled embeddings."""
    require_extra("sklearn", "bench")
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    t0 = time.perf_counter()
    model = LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto").fit(x_train, y_train)
    acc = float(np.mean(model.predict(x_test) == y_test))
    return ReferenceResult("sklearn_lda", acc, time.perf_counter() - t0)


def run_reference(
    name: str,
    x_train: NDArray[Any],
    y_train: NDArray[Any],
    x_test: NDArray[Any],
    y_test: NDArray[Any],
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    logreg_cs: tuple[float, ...] | None = None,
) -> ReferenceResult:
    """Run reference ``name``, with results cached on disk.

    The cache key hashes the four arrays, the reference name, its settings, the scikit-learn version
    and, for ``logreg``, the solver (``SOLVER``), so warm runs are instant. ``cache_dir=None`` uses
    ``GHOFL_CACHE_DIR`` or ``~/.cache/ghofl``. ``logreg_cs`` replaces the C grid of ``logreg`` (one
    value: that C, no cross-validation).
    """
    import sklearn

    from ghofl.client.cache import default_cache_dir

    h = hashlib.sha256()
    for a in (x_train, y_train, x_test, y_test):
        arr = np.ascontiguousarray(a)
        h.update(str((arr.shape, arr.dtype.str)).encode())
        h.update(arr.tobytes())
    h.update(f"{name}|{seed}|sklearn {sklearn.__version__}|v1".encode())
    if name == "logreg":
        h.update(f"|{SOLVER}".encode())
    if logreg_cs is not None and name == "logreg":
        h.update(f"|cs {[float(c) for c in logreg_cs]}".encode())
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "references" / f"{name}-{h.hexdigest()[:20]}.json"
    if path.exists():
        try:
            return ReferenceResult(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError):
            path.unlink(missing_ok=True)  # damaged entry: recompute
    if name == "logreg":
        if logreg_cs is None:
            res = logreg_reference(x_train, y_train, x_test, y_test, seed=seed)
        else:
            res = logreg_reference(x_train, y_train, x_test, y_test, seed=seed,
                                   cs=tuple(float(c) for c in logreg_cs))
    else:
        res = sklearn_lda_reference(x_train, y_train, x_test, y_test)
    text = json.dumps(asdict(res))
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    return res
