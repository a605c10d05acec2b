"""QDA against its BLAS floor, and the cost of choosing a shrinkage (issue 23).

Two sections, each timed side by side (:func:`ghofl.bench.harness.median_times`: every repeat
runs every step once, so a change in machine load falls on all of them alike):

*qda_floor*: synthetic `full` statistics at C = 200, d = 1280, 100 samples per class
(:mod:`ghofl.bench.spectrum`: power-law spectrum, per-class scales), 10,000 test samples.
The floor is the BLAS work QDA needs, written directly in numpy/SciPy with the same
hyperparameters (target ``"pooled"``, a = 0.1, pooled shrinkage 0.05): *fit*: B = the shrunk
pooled covariance, its Cholesky factor and inverse once, then per class the class covariance
from the sums, t_c = tr(B⁻¹Σ_c)/d, (1 − a)Σ_c + a·t_c·B, its Cholesky factor and log-det;
*predict*: per class a triangular solve of the (10,000, d) centred block and the squared
norms, then the argmax. The floor runs one class after another with one BLAS thread (the
fastest plain configuration here: see the validation section), and with the default BLAS
threads on the first :data:`DEFAULT_THREAD_CLASSES` classes, scaled to C. Against it:
``QDAHead(shrinkage=0.1, pooled_shrinkage=0.05)`` ``fit_from_stats`` and ``predict``. Target:
both ≤ 3× the floor; the predictions must equal the floor's.

*selection_cost*: C = 10, d = 1280, 1,000 samples per class (10,000 samples). Per head (LDA,
QDA, ridge) a fit at its default (the data-driven shrinkage) against a fit with every
coefficient fixed at the values the default chose (so both fits do the same work apart from
the choice), and the criterion's floor: the LAPACK work it reads and cannot do without
(:func:`criterion_floors`), so that floor / fixed for LDA (its default replaces the fixed
fit's Cholesky step) and (fixed + floor) / fixed for QDA (its floor comes on top of the fixed
fit: :data:`FLOOR_ADDS_FIT`) bound what any implementation of the same criterion can reach.
Target (issue 40): default ≤ 2× fixed.

Writes benchmarks/results/qda_floor.json and selection_cost.json and those sections of
BENCHMARKS.md. Run: ``.venv/bin/python benchmarks/bench_qda_floor.py [--repeats 3]``
(about 15 minutes on 2 cores; peak memory about 8 GB); ``--parts selection`` (or ``floor``)
runs one section only.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.bench import harness
from ghofl.bench.harness import SETTLE_S
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.bench.spectrum import class_statistics, draw, spectrum_classes
from ghofl.stats import ClientStats

F64 = NDArray[np.float64]
DIM = 1280
FLOOR_CLASSES = 200
FLOOR_PER_CLASS = 100
TEST_SAMPLES = 10_000
SHRINKAGE = 0.1
POOLED_SHRINKAGE = 0.05
#: Classes the default-thread floor runs (then scaled to C): with 2 OpenBLAS threads on a
#: loaded 2-core machine one class can take seconds.
DEFAULT_THREAD_CLASSES = 10
SELECTION_CLASSES = 10
SELECTION_PER_CLASS = 1000
FLOOR_TARGET = 3.0
SELECTION_TARGET = 2.0


def _load() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _one_thread(fn: Callable[[], Any]) -> Callable[[], None]:
    """``fn`` made to run with one BLAS thread (:func:`ghofl.heads._linalg.one_blas_thread`)."""
    from ghofl.heads._linalg import one_blas_thread

    def run() -> None:
        with one_blas_thread():
            fn()
    return run


# ------------------------------------------------------------------------------ the floor
def floor_fit(stats: ClientStats, classes: int | None = None) -> tuple[list[F64], F64]:
    """The BLAS floor of the QDA fit: per class the shrunk covariance, Cholesky, log-det.

    Returns the lower factors L_c and the half log-determinants (of the first ``classes``).
    """
    from scipy.linalg import cholesky, solve_triangular

    assert stats.class_scatter is not None
    counts = stats.counts.astype(np.float64)
    means = stats.sums / counts[:, None]
    d = means.shape[1]
    within = np.sum(stats.class_scatter, axis=0) - (stats.sums.T / counts) @ stats.sums
    pooled = within / (counts.sum() - counts.size)
    pooled = 0.5 * (pooled + pooled.T)
    center = (1.0 - POOLED_SHRINKAGE) * pooled
    center[np.diag_indices(d)] += POOLED_SHRINKAGE * np.trace(pooled) / d
    lb = cholesky(center, lower=True, check_finite=False)
    lb_inv = solve_triangular(lb, np.eye(d), lower=True, check_finite=False)
    center_inv = lb_inv.T @ lb_inv
    factors, half_logdet = [], []
    for c in range(stats.num_classes if classes is None else classes):
        cov = (stats.class_scatter[c] - counts[c] * np.outer(means[c], means[c])) / (counts[c] - 1)
        t = max(float(np.vdot(center_inv, cov)), 0.0) / d
        shrunk = (1.0 - SHRINKAGE) * (0.5 * (cov + cov.T)) + (SHRINKAGE * t) * center
        L = cholesky(shrunk, lower=True, overwrite_a=True, check_finite=False)
        factors.append(L)
        half_logdet.append(float(np.sum(np.log(np.diag(L)))))
    return factors, np.asarray(half_logdet)


def floor_predict(stats: ClientStats, factors: list[F64], half_logdet: F64, X: F64) -> F64:
    """Per class a triangular solve of the centred block and its squared norms; the argmax."""
    from scipy.linalg import solve_triangular

    counts = stats.counts.astype(np.float64)
    means = stats.sums / counts[:, None]
    scores = np.empty((X.shape[0], len(factors)))
    for c, L in enumerate(factors):
        y = solve_triangular(L, (X - means[c]).T, lower=True, check_finite=False)
        scores[:, c] = -0.5 * np.einsum("ij,ij->j", y, y) - half_logdet[c] + np.log(counts[c])
    out: F64 = np.argmax(scores, axis=1)
    return out


def measure_floor(repeats: int, log: Any) -> dict[str, Any]:
    """The ``qda_floor`` row: floor and ghofl, fit and predict."""
    from ghofl.heads.qda import QDAHead

    log(f"qda_floor: statistics C = {FLOOR_CLASSES}, d = {DIM} ...")
    gen = spectrum_classes(0, DIM, FLOOR_CLASSES)
    stats = class_statistics(gen, FLOOR_PER_CLASS, "full", 1)
    rng = np.random.default_rng(2)
    X = draw(gen, rng.integers(0, FLOOR_CLASSES, TEST_SAMPLES), rng)
    part = DEFAULT_THREAD_CLASSES
    kept: dict[str, Any] = {}

    def keep(name: str, fn: Any) -> Any:
        def run() -> None:
            kept[name] = fn()
        return run

    def ghofl_fit() -> Any:
        return QDAHead(shrinkage=SHRINKAGE,
                       pooled_shrinkage=POOLED_SHRINKAGE).fit_from_stats(stats)

    # the first repeat keeps what it computes: the fitted floor and head score the test set,
    # and their predictions are compared
    fns = {
        "floor_fit": _one_thread(keep("floor", lambda: floor_fit(stats))),
        "floor_fit_default_part": lambda: floor_fit(stats, part),
        "ghofl_fit": keep("head", ghofl_fit),
        "floor_predict": _one_thread(keep("floor_pred", lambda: floor_predict(
            stats, kept["floor"][0], kept["floor"][1], X))),
        "floor_predict_default_part": lambda: floor_predict(
            stats, kept["floor"][0][:part], kept["floor"][1][:part], X),
        "ghofl_predict": keep("pred", lambda: kept["head"].predict(X)),
    }
    log(f"qda_floor: timing {repeats} repeats (load {_load()}) ...")
    times = harness.median_times(fns, repeats)
    same = bool(np.array_equal(kept["pred"], kept["floor_pred"]))
    med = {k: v[0] for k, v in times.items()}
    scale = FLOOR_CLASSES / part
    # the default-thread floor's one-time pooled work is counted once, not scaled
    row: dict[str, Any] = {"classes": FLOOR_CLASSES, "dim": DIM, "per_class": FLOOR_PER_CLASS,
           "test_samples": TEST_SAMPLES, "same_predictions": same,
           "floor_fit_1thread_s": med["floor_fit"],
           "floor_fit_default_s": med["floor_fit_default_part"] * scale,
           "floor_predict_1thread_s": med["floor_predict"],
           "floor_predict_default_s": med["floor_predict_default_part"] * scale,
           "ghofl_fit_s": med["ghofl_fit"], "ghofl_predict_s": med["ghofl_predict"],
           "load_after": _load(), "samples": {k: v[1] for k, v in times.items()}}
    for step in ("fit", "predict"):
        floor = min(row[f"floor_{step}_1thread_s"], row[f"floor_{step}_default_s"])
        row[f"floor_{step}_s"] = floor
        row[f"{step}_ratio"] = row[f"ghofl_{step}_s"] / floor
        log(f"  {step}: floor {floor:.1f} s, ghofl {row[f'ghofl_{step}_s']:.1f} s "
            f"({row[f'{step}_ratio']:.2f}x)")
    return row


# ------------------------------------------------------------------ cost of the selection
def _heads(stats: ClientStats) -> dict[str, tuple[Any, Any]]:
    """(default head, the same head with the coefficients the default chose fixed)."""
    from ghofl.heads.lda import LDAHead
    from ghofl.heads.qda import QDAHead
    from ghofl.heads.ridge import RidgeHead
    from ghofl.moments.core import compute_moments
    from ghofl.moments.selection import choose_pooled_shrinkage

    lda = LDAHead().fit_from_stats(stats)
    qda = QDAHead().fit_from_stats(stats)
    ridge = RidgeHead().fit_from_stats(stats)
    pooled = choose_pooled_shrinkage(compute_moments(stats), "auto").value
    return {
        "lda": (LDAHead(), LDAHead(shrinkage=lda.shrinkage_)),
        "qda": (QDAHead(), QDAHead(shrinkage=qda.shrinkage_[0], pooled_shrinkage=pooled)),
        "ridge": (RidgeHead(), RidgeHead(alpha=ridge.alpha_)),
    }


def _spectrum(a: F64) -> None:
    """The eigenvalues of a symmetric ``a`` (d, d) as fast as LAPACK gives them (dsytrd, dsterf)."""
    from scipy.linalg import lapack

    d = a.shape[0]
    lwork = int(lapack.dsytrd_lwork(d, lower=1)[0])
    _, diag, off, _, info = lapack.dsytrd(np.asfortranarray(a), lower=1, lwork=lwork,
                                          overwrite_a=1)
    assert info == 0
    lapack.dsterf(diag, off)


def criterion_floors(stats: ClientStats) -> dict[str, Any]:
    """What a default fit cannot do without, written directly (LAPACK, default threads).

    *LDA*: the moments from the statistics (as every fit derives them) and the spectrum of
    the pooled covariance (one reduction to tridiagonal form and its eigenvalues: the
    analytic error reads the whole spectrum; the fitted solution then costs O(d²) per class
    from the same reduction, so the fixed fit's Cholesky factorisation is not needed).
    *QDA*: on top of the fixed fit (which it cannot avoid: the fitted head keeps a dense
    factor per class, which no eigenvalue gives), the spectrum of its centre (the default
    LDA's covariance) and per class ``dsygst`` and the eigenvalues of L⁻¹Σ_cL⁻ᵀ (B = LLᵀ),
    on which the evidence of every candidate is closed-form. The factor of B and the class
    covariances are prepared beforehand.
    """
    from scipy.linalg import cholesky, lapack

    from ghofl.moments.core import compute_moments

    m = compute_moments(stats)
    pooled = m.pooled_covariance("n-c")
    d = pooled.shape[0]
    center = 0.95 * pooled + 0.05 * np.trace(pooled) / d * np.eye(d)
    chol = np.asfortranarray(cholesky(center, lower=True, check_finite=False))
    covs = [np.asfortranarray(m.class_covariance(c, "n-1")) for c in range(m.num_classes)]

    def qda() -> None:
        _spectrum(pooled)
        for cov in covs:
            white, info = lapack.dsygst(cov, chol, itype=1, lower=1)
            assert info == 0
            _spectrum(white)

    return {"lda": lambda: _spectrum(compute_moments(stats).pooled_covariance("n-c")),
            "qda": qda}


#: Heads whose criterion floor comes on top of the fixed fit (the rest replace it).
FLOOR_ADDS_FIT = frozenset({"qda"})


def measure_selection(repeats: int, log: Any) -> dict[str, Any]:
    """The ``selection_cost`` rows: default against fixed, per head, and the criteria's floor."""
    log(f"selection_cost: statistics C = {SELECTION_CLASSES}, d = {DIM} ...")
    gen = spectrum_classes(3, DIM, SELECTION_CLASSES)
    stats = class_statistics(gen, SELECTION_PER_CLASS, "full", 4)
    heads = _heads(stats)
    floors = criterion_floors(stats)
    fns = {}
    for name, (auto, fixed) in heads.items():
        fns[f"{name}_auto"] = lambda h=auto: h.fit_from_stats(stats)
        fns[f"{name}_fixed"] = lambda h=fixed: h.fit_from_stats(stats)
        fns[f"{name}_auto_1t"] = _one_thread(lambda h=auto: h.fit_from_stats(stats))
        fns[f"{name}_fixed_1t"] = _one_thread(lambda h=fixed: h.fit_from_stats(stats))
    for name, fn in floors.items():
        fns[f"{name}_floor"] = fn
        fns[f"{name}_floor_1t"] = _one_thread(fn)
    log(f"selection_cost: timing {repeats} repeats (load {_load()}) ...")
    times = harness.median_times(fns, repeats, settle=SETTLE_S)
    rows = []
    for name, (_, fixed) in heads.items():
        a, f = times[f"{name}_auto"][0], times[f"{name}_fixed"][0]
        a1, f1 = times[f"{name}_auto_1t"][0], times[f"{name}_fixed_1t"][0]
        params = {k: v for k, v in fixed.get_params().items()
                  if k in ("shrinkage", "pooled_shrinkage", "alpha")}
        row = {"head": name, "auto_s": a, "fixed_s": f, "ratio": a / f,
               "auto_1thread_s": a1, "fixed_1thread_s": f1, "ratio_1thread": a1 / f1,
               "chosen": {k: float(v) for k, v in params.items()},
               "samples": {k: times[f"{name}_{k}"][1]
                           for k in ("auto", "fixed", "auto_1t", "fixed_1t")}}
        if name in floors:
            fl, fl1 = times[f"{name}_floor"][0], times[f"{name}_floor_1t"][0]
            add, add1 = (f, f1) if name in FLOOR_ADDS_FIT else (0.0, 0.0)
            row.update(floor_s=fl, least_ratio=(add + fl) / f, floor_1thread_s=fl1,
                       least_ratio_1thread=(add1 + fl1) / f1,
                       floor_samples=times[f"{name}_floor"][1],
                       floor_1thread_samples=times[f"{name}_floor_1t"][1])
        rows.append(row)
        log(f"  {name}: default {a:.2f} s, fixed {f:.2f} s ({a / f:.2f}x); one BLAS thread "
            f"{a1:.2f} s, {f1:.2f} s ({a1 / f1:.2f}x)"
            + (f"; criterion floor {row['floor_s']:.2f} s (least {row['least_ratio']:.2f}x)"
               if "floor_s" in row else ""))
    return {"classes": SELECTION_CLASSES, "dim": DIM, "per_class": SELECTION_PER_CLASS,
            "settle_s": SETTLE_S, "load_after": _load(), "rows": rows}


def measure(ctx: harness.Context) -> dict[str, Any]:
    base = {"machine": machine_summary(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "repeats": ctx.args.repeats}
    out: dict[str, Any] = {}
    if "selection" in ctx.args.parts:
        out["selection_cost"] = {**base, "load_before": _load(),
                                 **measure_selection(ctx.args.repeats, ctx.log)}
        gc.collect()
    if "floor" in ctx.args.parts:
        out["qda_floor"] = {**base, "load_before": _load(),
                            **measure_floor(ctx.args.repeats, ctx.log)}
    return out


# ----------------------------------------------------------------------------- rendering
def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def render_floor(results: dict[str, Any]) -> str:
    r = results
    lines = [
        "## QDA against its BLAS floor (`benchmarks/bench_qda_floor.py`)", "",
        f"Measured {r['date']}. Machine: {r['machine']}. Load average (1, 5, 15 min) "
        f"{r['load_before']} before, {r['load_after']} after: a machine shared with other "
        f"jobs. Synthetic `full` statistics, C = {r['classes']}, d = {r['dim']}, "
        f"{r['per_class']} samples per class (`ghofl.bench.spectrum`); {r['test_samples']:,} "
        "test samples; target `pooled`, a = 0.1, pooled shrinkage 0.05. Medians of "
        f"{r['repeats']} side-by-side repeats. *Floor*: the BLAS work written directly in "
        "numpy/SciPy (fit: per class the shrunk covariance, Cholesky, log-det; predict: per "
        "class a triangular solve of the centred test block and its squared norms), class "
        "after class, with one BLAS thread and with the default threads (the latter timed on "
        f"{DEFAULT_THREAD_CLASSES} classes and scaled to C); the faster of the two. *ghofl*: "
        "`QDAHead(shrinkage=0.1, pooled_shrinkage=0.05)`: `fit_from_stats`, `predict`. Target "
        f"(issue 23): both ≤ {FLOOR_TARGET:g}× the floor, predictions unchanged.", ""]
    body = []
    for step in ("fit", "predict"):
        body.append([step, f"{r[f'floor_{step}_1thread_s']:.1f}",
                     f"{r[f'floor_{step}_default_s']:.1f}", f"{r[f'ghofl_{step}_s']:.1f}",
                     f"{r[f'{step}_ratio']:.2f}x",
                     _verdict(r[f"{step}_ratio"] <= FLOOR_TARGET)])
    lines.append(markdown_table(
        ["step", "floor s (1 thread)", "floor s (default threads)", "ghofl s",
         "ghofl / floor", "target ≤ 3x"], body))
    lines += ["", "Predictions of ghofl identical to the floor's: "
              f"{'yes' if r['same_predictions'] else 'NO'}."]
    return "\n".join(lines)


def _selection_verdict(ratio: float, least: float | None) -> str:
    if ratio <= SELECTION_TARGET:
        return "met"
    if least is not None and least > SELECTION_TARGET:
        return f"NOT met: unreachable (floor {least:.2f}x)"
    return "NOT met"


def render_selection(results: dict[str, Any]) -> str:
    r = results
    lines = [
        "## Cost of the data-driven shrinkage (`benchmarks/bench_qda_floor.py`)", "",
        f"Measured {r['date']}. Machine: {r['machine']}. Load average (1, 5, 15 min) "
        f"{r['load_before']} before, {r['load_after']} after. Synthetic `full` statistics, "
        f"C = {r['classes']}, d = {r['dim']}, {r['per_class']:,} samples per class "
        "(`ghofl.bench.spectrum`). `fit_from_stats` at the head's default (shrinkage chosen "
        "from the statistics, no held-out part: LDA the analytic error estimate, QDA the "
        "inverse-Wishart evidence toward the default LDA's covariance, ridge GCV) against the "
        "same head with every coefficient fixed at the values the default chose; medians of "
        f"{r['repeats']} side-by-side repeats (each step timed {r.get('settle_s', 0):g} s after "
        "the one before, once the BLAS threads it woke have parked), with the default BLAS "
        "threads and with the whole fit under one BLAS thread (`threadpoolctl`). "
        "*Criterion floor*: what the default "
        "fit cannot do without, written directly (LAPACK) and timed in the same repeats: LDA "
        "the moments and the spectrum of the pooled covariance (`dsytrd`, `dsterf`: the "
        "analytic error reads the whole spectrum; the solution then costs O(d²) per class "
        "from the same reduction, so no Cholesky factorisation is needed); QDA, on top of "
        "the fixed fit (the head keeps a dense factor per class, which no eigenvalue gives), "
        "the spectrum of its centre and per class `dsygst` and the eigenvalues of "
        "L⁻¹Σ_cL⁻ᵀ (the evidence of every candidate is closed-form on them). *Least ratio* = "
        "floor / fixed (LDA), (fixed + floor) / fixed (QDA): the bound of any implementation "
        f"of the same criterion. Target (issue 40): default ≤ {SELECTION_TARGET:g}× fixed, "
        "choosing the same values.", ""]
    body = []
    for row in r["rows"]:
        least = row.get("least_ratio")
        body.append([
            row["head"], f"{row['auto_s']:.3f}", f"{row['fixed_s']:.3f}",
            f"{row['ratio']:.2f}x", f"{row['auto_1thread_s']:.3f}",
            f"{row['fixed_1thread_s']:.3f}", f"{row['ratio_1thread']:.2f}x",
            "—" if least is None else f"{row['floor_s']:.3f} / {row['floor_1thread_s']:.3f}",
            "—" if least is None
            else f"{least:.2f}x / {row['least_ratio_1thread']:.2f}x",
            ", ".join(f"{k} {v:.4g}" for k, v in sorted(row["chosen"].items())),
            f"{_selection_verdict(row['ratio'], least)} / "
            f"{_selection_verdict(row['ratio_1thread'], row.get('least_ratio_1thread'))}"])
    lines.append(markdown_table(
        ["head", "default s", "fixed s", "default / fixed", "default s (1 thread)",
         "fixed s (1 thread)", "default / fixed (1 thread)",
         "criterion floor s (default threads / 1 thread)", "least ratio (default / 1 thread)",
         "chosen (fixed at)", "target ≤ 2x (default threads / 1 thread)"],
        body))
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", nargs="+", choices=("floor", "selection"),
                    default=["selection", "floor"])


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("qda_floor", "qda_floor.json", render_floor,
                              states_machine=True),
              harness.Section("selection_cost", "selection_cost.json", render_selection,
                              states_machine=True)),
    measure=measure,
    timings=True,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
