"""Centralised reference rows on the same features: the ceiling one-shot heads are measured against.

* ``logreg``: multinomial logistic regression on standardised real embeddings, inverse
  regularisation C chosen by stratified k-fold cross-validation on the TRAIN split only
  (on a stratified subsample of at most ``cv_max_samples`` rows to bound its cost), then refit
  on the whole train split.
* ``sklearn_lda``: scikit-learn ``LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto")``
  (Ledoit–Wolf) on the pooled real embeddings.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import require_extra
from ghofl.stats.codec import atomic_write


@dataclass
class ReferenceResult:
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
    """Centralised logistic-regression probe with C chosen by CV on train only (a single
    value in ``cs`` is used as is, without cross-validation)."""
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
    """The fitted probe of :func:`logreg_reference` (a scikit-learn pipeline with ``predict``)
    and its details (chosen C, CV scores), for scoring several test sets with one fit."""
    require_extra("sklearn", "bench")
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score, train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    xs, ys = x_train, y_train
    if len(y_train) > cv_max_samples:
        xs, _, ys, _ = train_test_split(
            x_train, y_train, train_size=cv_max_samples, stratify=y_train, random_state=seed
        )
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    scores: dict[float, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for c in cs if len(cs) > 1 else ():  # one C: nothing to choose
            model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=max_iter))
            scores[c] = float(np.mean(cross_val_score(model, xs, ys, cv=cv)))
        best = max(scores, key=lambda k: scores[k]) if scores else cs[0]
        final = make_pipeline(StandardScaler(), LogisticRegression(C=best, max_iter=max_iter))
        final.fit(x_train, y_train)
    return final, {
        "C": best,
        "cv_scores": {str(k): v for k, v in scores.items()},
        "cv_samples": len(ys) if scores else 0,
        "folds": folds if scores else 0,
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
    """Run reference ``name``; results are cached on disk keyed by a hash of the four arrays,
    the reference name, its settings and the scikit-learn version (so warm runs are instant).
    ``cache_dir=None`` uses ``GHOFL_CACHE_DIR`` or ``~/.cache/ghofl``. ``logreg_cs`` replaces
    the C grid of ``logreg`` (one value: that C, no cross-validation)."""
    import sklearn

    from ghofl.client.cache import default_cache_dir

    h = hashlib.sha256()
    for a in (x_train, y_train, x_test, y_test):
        arr = np.ascontiguousarray(a)
        h.update(str((arr.shape, arr.dtype.str)).encode())
        h.update(arr.tobytes())
    h.update(f"{name}|{seed}|sklearn {sklearn.__version__}|v1".encode())
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
