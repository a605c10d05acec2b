"""Issue 39: the one-shot peers at their best beside ghofl's heads, same features, same bytes.

Data sets (identical features per set, from the embedding cache): CIFAR-10 and Tiny-ImageNet
(EfficientNet-Lite0 at 224 px, the features of every other image table), TREC, SST-2 and AG News
(MiniLM). Protocols: FedCOF's (100 clients) and GH-OFL's (10 clients), Dirichlet label skew
α = 0.1; one part per (data set, clients, seed), each seed its own partition.

Streaming: the clients' statistics are computed one client at a time and added into running
totals (float64 and, through :func:`~ghofl.stats.transport.through_transport`, float32
transport); for FedCOF the server keeps only what its estimator needs per client, the class
counts and sums (mode ``means``), so the memory of every other method does not grow with K.

Validation: each client's rows are split 90 / 10 at random (:func:`ghofl.bench.peers.
split_validation`); every method is fitted on the 90 % totals and scored on the 10 % rows,
and refitted on all rows (90 % + 10 % totals) for the test score. What is chosen there:

- FedNCM (``ncm``, cosine; no hyperparameter);
- Fed3R as shipped (the FedCOF repository's server: float32 pseudo-inverse of G + λI,
  λ = 0.01, no intercept, normalised weights) and Fed3R tuned: the best on validation of
  {intercept (features augmented by 1), float64 Cholesky, λ ∈ FED3R_LAMBDAS, normalised or
  not} ∪ {as shipped at λ ∈ FED3R_LAMBDAS};
- FedCOF default (γ = 1) and FedCOF tuned (γ ∈ FEDCOF_GAMMAS), ``fedcof`` head on
  :func:`~ghofl.moments.fedcof.fedcof_statistics` of the clients' means;
- ghofl: nearest class mean (the ``ncm`` head: FedNCM's classifier, here on the securely summed
  class sums of a ``means`` upload), default naive Bayes on ``diag`` sums, LDA and ridge on
  ``pooled`` sums and QDA on ``full`` sums (where C·d² ≤ FULL_LIMIT), and LDA / ridge on ``gram``
  sums of public random projections (and, with ``--pca``, of the public Tiny-ImageNet principal
  basis of ``bench_accuracy_bytes.py``; CIFAR-10 only) at the largest k whose upload fits each
  peer's bytes, each in float64 and float32 transport; and LDA / ridge (QDA where C·d² ≤
  FULL_LIMIT) on FedCOF's estimate from the same means-only upload as FedCOF (setting ``means
  (FedCOF estimate)``, float64 and float32 transport; the heads' data-driven shrinkage reads the
  estimate's degrees of freedom). At each peer's bytes ghofl's setting and head are chosen on
  validation.

Secure aggregation: every ghofl setting but the FedCOF estimate uploads sums, which the server
may receive only summed over the clients; the estimate, like FedCOF, needs every client's class
means (records carry ``secure``; the verdicts say whether the chosen setting is secure and, when
it is not, also give the best secure one).

Verdicts by :func:`ghofl.bench.peers.decide_lead` (mean ± standard error over the seeds; a
lead or a shortfall is decided only beyond twice its standard error).

Resumable: each part is written to ``benchmarks/results/peers/<data set>-K<clients>-s<seed>
.json`` when it finishes; a rerun skips existing parts (``--fresh`` measures them again) and the
section and the plots ``benchmarks/results/peers_<data set>.png`` render from every part there.

Run: ``python benchmarks/bench_peers.py --datasets trec --clients 100,10 --seeds 0,1,2``
(one data set's rows). ``--quick``: TREC and CIFAR-10 at 100 / 50 rows per class, K = 10,
seed 0; prints the section, writes nothing (so do ``--train-per-class`` runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.bench import harness
from ghofl.bench.config import config_from_dict
from ghofl.bench.decide import fmt_mean_se, mean_se
from ghofl.bench.features import Features, load_features
from ghofl.bench.peers import (
    FED3R_LAMBDAS,
    FEDCOF_GAMMAS,
    decide_lead,
    fed3r_bytes,
    fed3r_system,
    fed3r_weights,
    largest_dim,
    linear_predict,
    split_validation,
)
from ghofl.bench.provenance import CODE_KEY
from ghofl.bench.report import markdown_table, write_json
from ghofl.data.partition import dirichlet_partition
from ghofl.data.registry import subsample
from ghofl.heads import make_head
from ghofl.moments.fedcof import fedcof_statistics
from ghofl.stats import ClientStats, ProjectionSpec, compute_stats
from ghofl.stats.meta import Mode
from ghofl.stats.schema import schema_for
from ghofl.stats.transport import through_transport

RESULTS = "peers"
ALPHA = 0.1
VAL_FRACTION = 0.1
RESOLUTION = 224
#: C·d² above which mode ``full`` (QDA) is left out (Tiny-ImageNet: 200 · 1280² = 3.3e8).
FULL_LIMIT = 1e8
DTYPES = ("float64", "float32")
DATASETS = {"cifar10": "efficientnet-lite0", "tiny-imagenet": "efficientnet-lite0",
            "trec": "minilm", "sst2": "minilm", "agnews": "minilm"}
#: Principal directions in the public basis of raw features (``bench_accuracy_bytes.py``
#: keeps 768): a ``pca`` setting of larger k is left out.
PCA_MAX_K = 768
#: --quick: (data sets, train rows per class, test rows per class)
QUICK = ("trec,cifar10", 100, 50)
PEERS = ("FedNCM", "Fed3R", "FedCOF")
#: ghofl's default heads per upload mode
HEADS = {"means": ("ncm",), "diag": ("nb",), "pooled": ("lda", "ridge"),
         "gram": ("lda", "ridge"), "full": ("qda",)}
#: ghofl's heads also tuned on validation, as the peers are (``pooled`` settings): the
#: parameter and its candidates beside the default ``"auto"``
TUNED = {"lda": ("shrinkage", (0.001, 0.003, 0.01, 0.03, 0.1, 0.2, 0.3, 0.5)),
         "ridge": ("alpha", (1e-4, 3e-4, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3))}
#: ghofl's setting on FedCOF's estimate from the clients' means (not secure-aggregatable)
ESTIMATE = "means (FedCOF estimate)"

Rows = tuple[NDArray[Any], NDArray[np.int64]]


# ---------------------------------------------------------------- settings and streaming

def settings_for(c: int, d: int, budgets: list[int], pca: bool) -> list[dict[str, Any]]:
    """ghofl's upload settings: raw ``means``, ``diag``, ``pooled`` (and ``full``), projections
    fitting ``budgets``."""
    out = [{"proj": "none", "k": 0, "mode": m} for m in ("means", "diag", "pooled")]
    if c * d * d <= FULL_LIMIT:
        out.append({"proj": "none", "k": 0, "mode": "full"})
    ks = sorted({k for b in budgets for dt in DTYPES
                 if (k := largest_dim(b, c, "gram", dt, below=d)) is not None})
    for kind in ("random", "pca") if pca else ("random",):
        out += [{"proj": kind, "k": k, "mode": "gram"} for k in ks
                if kind == "random" or k <= PCA_MAX_K]
    return out


def setting_label(s: dict[str, Any]) -> str:
    return f"{s['mode']}" if s["proj"] == "none" else f"{s['mode']} {s['proj']} k={s['k']}"


def _spec(s: dict[str, Any], d: int, seed: int, basis: str | None) -> ProjectionSpec | None:
    if s["proj"] == "none":
        return None
    if s["proj"] == "random":
        return ProjectionSpec(seed, d, s["k"])
    from ghofl.stats.projection import PCA_GENERATOR

    if basis is None:
        raise harness.BenchmarkError("a 'pca' setting needs the public basis: pass --pca")
    return ProjectionSpec(0, d, s["k"], PCA_GENERATOR, basis)


def _add(total: ClientStats | None, st: ClientStats) -> ClientStats:
    return st if total is None else total + st


def stream(f: Features, split: list[tuple[Any, Any]], sets: list[dict[str, Any]], seed: int,
           basis: str | None) -> tuple[dict[tuple[str, str, str], ClientStats], list[Any]]:
    """Running totals ``(setting, dtype, "fit"|"val") -> stats`` and FedCOF's per-client means.

    Returns the totals and ``[(means of the 90 % rows, means of all rows)]`` per client.
    """
    x, y = f.x_train, f.y_train
    d = x.shape[1]
    raw = "full" if any(s["mode"] == "full" for s in sets) else "pooled"
    derived = [s["mode"] for s in sets if s["proj"] == "none" and s["mode"] != raw]
    totals: dict[tuple[str, str, str], Any] = {}
    means: list[tuple[ClientStats, ClientStats]] = []
    for fit_idx, val_idx in split:
        if not len(fit_idx):
            continue  # a client without rows uploads nothing
        for s in sets:
            if s["proj"] == "none" and s["mode"] != raw:
                continue  # derived exactly from the raw upload of the same rows, below
            spec = _spec(s, d, seed, basis)
            up = {"fit": compute_stats(x[fit_idx], y[fit_idx], f.classes, s["mode"],
                                       f.encoder_info, spec)}
            if len(val_idx):
                up["val"] = compute_stats(x[val_idx], y[val_idx], f.classes, s["mode"],
                                          f.encoder_info, spec)
            if s["proj"] == "none":
                means.append((up["fit"].to_mode("means"), _add(up.get("val"), up["fit"])
                              .to_mode("means")))
                for mode in derived:
                    _accumulate(totals, mode, {k: v.to_mode(mode) for k, v in up.items()})
            _accumulate(totals, setting_label(s), up)
    return totals, means


def _accumulate(totals: dict[Any, Any], label: str, stats: dict[str, ClientStats]) -> None:
    """Add one client's uploads into the running totals, per transport dtype."""
    for part, st in stats.items():
        for dt in DTYPES:
            key = (label, dt, part)
            totals[key] = _add(totals.get(key), through_transport(st, dt))


# ---------------------------------------------------------------- the methods

def _acc(pred: NDArray[Any], y: NDArray[Any]) -> float:
    return float(np.mean(pred == y))


def _both(fit: ClientStats, full: ClientStats, head: str, val: Rows, test: Rows,
          **params: Any) -> tuple[float, float]:
    """(validation accuracy of ``head`` fitted on ``fit``, test accuracy fitted on ``full``)."""
    v = _acc(make_head(head, **params).fit_from_stats(fit).predict(val[0]), val[1])
    t = _acc(make_head(head, **params).fit_from_stats(full).predict(test[0]), test[1])
    return v, t


def ghofl_records(totals: dict[Any, ClientStats], sets: list[dict[str, Any]], c: int,
                  val: Rows, test: Rows) -> list[dict[str, Any]]:
    """LDA / ridge (QDA on ``full``) per setting and transport dtype."""
    out = []
    for s in sets:
        label = setting_label(s)
        heads = HEADS[s["mode"]]
        k = s["k"] or val[0].shape[1]
        for dt in DTYPES:
            fit = totals[(label, dt, "fit")]
            held = totals.get((label, dt, "val"))
            full = fit if held is None else fit + held
            nbytes = schema_for(s["mode"]).nbytes(c, k, float_dtype=dt)
            for h in heads:
                v, t = _both(fit, full, h, val, test)
                out.append({"family": "ghofl", "method": f"ghofl {h}", "setting": label,
                            "dtype": dt, "config": "default", "secure": True,
                            "bytes": nbytes, "val": v, "test": t})
            if s["mode"] == "pooled":
                out += [{**r, "setting": label, "dtype": dt, "secure": True, "bytes": nbytes}
                        for r in tuned_records(fit, full, val, test)]
    return out


def tuned_records(fit: ClientStats, full: ClientStats, val: Rows,
                  test: Rows) -> list[dict[str, Any]]:
    """LDA and ridge with their coefficient chosen on validation (the default ``"auto"`` among
    the candidates of :data:`TUNED`), refitted on all rows for the test score."""
    out = []
    for h, (param, grid) in TUNED.items():
        cands: list[Any] = ["auto", *grid]
        vals = [_acc(make_head(h, **{param: a}).fit_from_stats(fit).predict(val[0]), val[1])
                for a in cands]
        best = cands[int(np.argmax(vals))]
        test_acc = _acc(make_head(h, **{param: best}).fit_from_stats(full).predict(test[0]),
                        test[1])
        out.append({"family": "ghofl", "method": f"ghofl {h} (tuned)",
                    "config": f"{param} = {best if best == 'auto' else format(best, 'g')}",
                    "choice": best, "val": max(vals), "test": test_acc})
    return out


def estimate_records(means: list[tuple[ClientStats, ClientStats]], c: int, d: int, val: Rows,
                     test: Rows) -> list[dict[str, Any]]:
    """ghofl's heads on FedCOF's estimate from the clients' means (FedCOF's own upload).

    LDA and ridge on the ``pooled`` estimate and, where C·d² ≤ FULL_LIMIT, QDA on the ``full``
    one, each with its default data-driven shrinkage, in float64 and float32 transport of every
    client's ``means`` upload. ``means``: per client, (``means`` of its 90 % rows, of all rows).
    """
    modes: dict[Mode, tuple[str, ...]] = {"pooled": HEADS["pooled"]}
    if c * d * d <= FULL_LIMIT:
        modes["full"] = HEADS["full"]
    out = []
    for dt in DTYPES:
        ups = [(through_transport(m, dt), through_transport(a, dt)) for m, a in means]
        for mode, heads in modes.items():
            fit = fedcof_statistics([m for m, _ in ups], mode)
            full = fedcof_statistics([a for _, a in ups], mode)
            for h in heads:
                v, t = _both(fit, full, h, val, test)
                out.append({"family": "ghofl", "method": f"ghofl {h}", "setting": ESTIMATE,
                            "dtype": dt, "config": "default", "secure": False,
                            "bytes": schema_for("means").nbytes(c, d, float_dtype=dt),
                            "val": v, "test": t})
    return out


def fed3r_candidates() -> list[dict[str, Any]]:
    """Fed3R's configurations tried on validation (as shipped first)."""
    shipped = [{"intercept": False, "solver": "pinv32", "lam": lam, "normalize": True}
               for lam in FED3R_LAMBDAS]
    ours = [{"intercept": True, "solver": "cholesky", "lam": lam, "normalize": nz}
            for lam in FED3R_LAMBDAS for nz in (True, False)]
    return shipped + ours


def _fed3r_fit(st: ClientStats, cfg: dict[str, Any]) -> Any:
    g, a = fed3r_system(np.asarray(st.scatter), st.sums, st.counts, cfg["intercept"])
    return fed3r_weights(g, a, cfg["lam"], cfg["solver"], cfg["normalize"])


def _fed3r_config(cfg: dict[str, Any]) -> str:
    how = ("float32 pinv, no intercept" if cfg["solver"] == "pinv32"
           else "intercept, float64 Cholesky")
    return f"λ = {cfg['lam']:g}, {how}, {'normalised' if cfg['normalize'] else 'raw'} weights"


def peer_records(fit: ClientStats, full: ClientStats, means: list[Any], c: int, d: int,
                 val: Rows, test: Rows) -> list[dict[str, Any]]:
    """FedNCM; Fed3R as shipped and tuned; FedCOF at γ = 1 and tuned."""
    nb_means = schema_for("means").nbytes(c, d)
    v, t = _both(fit, full, "ncm", val, test)
    out = [{"family": "peer", "peer": "FedNCM", "method": "FedNCM", "config": "cosine",
            "bytes": nb_means, "val": v, "test": t}]
    cands = fed3r_candidates()
    vals = [_acc(linear_predict(val[0], _fed3r_fit(fit, cfg), cfg["intercept"]), val[1])
            for cfg in cands]
    shipped = next(i for i, cfg in enumerate(cands) if cfg["lam"] == 0.01)
    for name, i in (("Fed3R (as shipped)", shipped), ("Fed3R (tuned)", int(np.argmax(vals)))):
        cfg = cands[i]
        acc = _acc(linear_predict(test[0], _fed3r_fit(full, cfg), cfg["intercept"]), test[1])
        out.append({"family": "peer", "peer": "Fed3R", "method": name,
                    "config": _fed3r_config(cfg), "choice": cfg,
                    "bytes": fed3r_bytes(c, d, cfg["intercept"]), "val": vals[i], "test": acc})
    est_fit = fedcof_statistics([m for m, _ in means])
    est_all = fedcof_statistics([m for _, m in means])
    gvals = [_acc(make_head("fedcof", gamma=g, n_calibration=0).fit_from_stats(est_fit)
                  .predict(val[0]), val[1]) for g in FEDCOF_GAMMAS]
    for name, i in (("FedCOF (γ = 1)", FEDCOF_GAMMAS.index(1.0)),
                    ("FedCOF (tuned)", int(np.argmax(gvals)))):
        g = FEDCOF_GAMMAS[i]
        acc = _acc(make_head("fedcof", gamma=g, n_calibration=0).fit_from_stats(est_all)
                   .predict(test[0]), test[1])
        out.append({"family": "peer", "peer": "FedCOF", "method": name, "config": f"γ = {g:g}",
                    "choice": {"gamma": g}, "bytes": nb_means, "val": gvals[i], "test": acc})
    return out


def run_part(f: Features, k: int, seed: int, pca_basis: str | None,
             log: Any) -> dict[str, Any]:
    """Every method on one (data set, K, seed) partition."""
    c, d = len(f.classes), f.x_train.shape[1]
    t0 = time.perf_counter()
    parts = dirichlet_partition(f.y_train, k, ALPHA, seed=seed)  # empty clients allowed
    split = split_validation(parts, VAL_FRACTION, seed)
    val_idx = np.sort(np.concatenate([v for _, v in split]))
    val: Rows = (f.x_train[val_idx], f.y_train[val_idx])
    test: Rows = (f.x_test, f.y_test)
    budgets = [schema_for("means").nbytes(c, d), fed3r_bytes(c, d, False),
               fed3r_bytes(c, d, True)]
    sets = settings_for(c, d, budgets, pca_basis is not None)
    totals, means = stream(f, split, sets, seed, pca_basis)
    t1 = time.perf_counter()
    raw_fit = totals[("pooled", "float64", "fit")]
    raw_all = raw_fit + totals[("pooled", "float64", "val")]
    recs = peer_records(raw_fit, raw_all, means, c, d, val, test)
    t2 = time.perf_counter()
    recs += ghofl_records(totals, sets, c, val, test) + estimate_records(means, c, d, val, test)
    t3 = time.perf_counter()
    for r in recs:
        log(f"  {f.dataset} K={k} s={seed} {r['method']:22s} {r.get('setting', ''):22s} "
            f"{r.get('dtype', ''):8s} {r['bytes'] / 1e3:9.1f} KB  val {100 * r['val']:5.1f}  "
            f"test {100 * r['test']:5.1f}")
    return {"dataset": f.dataset, "clients": k, "alpha": ALPHA, "seed": seed,
            "classes": c, "dim": d, "n_train": len(f.y_train), "n_test": len(f.y_test),
            "n_val": len(val_idx), "empty_clients": sum(len(p) == 0 for p in parts),
            "records": recs,
            "seconds": {"stream": t1 - t0, "peers": t2 - t1, "ghofl": t3 - t2}}


# ---------------------------------------------------------------- measuring

def part_name(dataset: str, clients: int, seed: int) -> str:
    """``<dataset>-K<clients>-s<seed>.json``."""
    return f"{dataset}-K{clients}-s{seed}.json"


def load_parts(path: Path) -> dict[str, Any]:
    """Every saved part under ``path``, by file name (sorted)."""
    return {"parts": {p.name: json.loads(p.read_text()) for p in sorted(path.glob("*.json"))}}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--datasets", default="cifar10,tiny-imagenet,trec,sst2,agnews")
    ap.add_argument("--clients", default="100,10")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--train-per-class", type=int, default=0,
                    help="a subset (0: all); a subset's parts are printed, never written")
    ap.add_argument("--test-per-class", type=int, default=0)
    ap.add_argument("--pca", action="store_true",
                    help="add the public Tiny-ImageNet principal basis of "
                         "bench_accuracy_bytes.py (CIFAR-10 only; needs Tiny-ImageNet train "
                         "features)")
    ap.add_argument("--quick", action="store_true",
                    help="TREC and CIFAR-10 at 100 / 50 per class, K 10, seed 0; writes nothing")
    ap.add_argument("--fresh", action="store_true", help="measure existing parts again")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _features(name: str, data_dir: str | None, per_train: int, per_test: int) -> Features:
    if name not in DATASETS:
        raise harness.BenchmarkError(f"unknown data set {name!r}; choose from "
                                     f"{', '.join(DATASETS)}")
    cfg = config_from_dict({"datasets": [name], "resolution": RESOLUTION, "data_dir": data_dir})
    f = load_features(name, DATASETS[name], cfg)
    # a subset of the cached features (the same rows on every run; nothing re-embedded)
    tr = subsample(f.y_train, per_class=per_train, seed=0) if per_train else slice(None)
    te = subsample(f.y_test, per_class=per_test, seed=0) if per_test else slice(None)
    return replace(f, x_train=f.x_train[tr], y_train=f.y_train[tr], x_test=f.x_test[te],
                   y_test=f.y_test[te])


def _pca_basis(f: Features, log: Any) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_accuracy_bytes import public_bases

    return public_bases(f.encoder_info, log)["none"]


def measure(ctx: harness.Context) -> dict[str, Any] | None:
    args = ctx.args
    quick = bool(args.quick)
    per_train, per_test = ((QUICK[1], QUICK[2]) if quick
                           else (int(args.train_per_class), int(args.test_per_class)))
    subset = bool(per_train or per_test)
    names = str(QUICK[0] if quick else args.datasets).split(",")
    ks, seeds = ([10], [0]) if quick else (_ints(args.clients), _ints(args.seeds))
    folder = ctx.results_dir / RESULTS
    parts = {} if subset else load_parts(folder)["parts"]
    write = not (subset or args.no_write)
    for ds in [n for n in names if n]:
        todo = [(k, s) for k in ks for s in seeds
                if args.fresh or part_name(ds, k, s) not in parts]
        if not todo:
            continue
        f = _features(ds, ctx.data_dir(required=False), per_train, per_test)
        basis = _pca_basis(f, ctx.log) if args.pca and ds == "cifar10" else None
        for k, seed in todo:
            t = time.perf_counter()
            part = run_part(f, k, seed, basis, ctx.log)
            part.update({"encoder": f"{f.encoder_name}" + ("" if DATASETS[ds] == "minilm"
                                                           else f" @ {RESOLUTION} px"),
                         "subset": [per_train, per_test], "pca_basis": basis,
                         "machine": harness.machine_summary(),
                         "date": time.strftime("%Y-%m-%d"), CODE_KEY: ctx.code_version()})
            name = part_name(ds, k, seed)
            parts[name] = part
            ctx.log(f"{name}: {time.perf_counter() - t:.0f} s {part['seconds']}")
            if write:
                write_json(folder / name, part)
    if subset:
        print(render({"parts": parts, "subset": True}))
        return None
    return {RESULTS: {"parts": parts}}


# ---------------------------------------------------------------- rendering

def _cells(parts: dict[str, Any]) -> dict[tuple[str, int], dict[tuple[str, ...], list[Any]]]:
    """(data set, K) -> (method, setting, dtype) -> the per-seed records (by seed)."""
    out: dict[tuple[str, int], dict[tuple[str, ...], list[Any]]] = {}
    for name in sorted(parts):
        p = parts[name]
        at = out.setdefault((p["dataset"], int(p["clients"])), {})
        for r in p["records"]:
            key = (r["method"], r.get("setting", ""), r.get("dtype", ""))
            at.setdefault(key, []).append({**r, "seed": p["seed"]})
    for at in out.values():
        for recs in at.values():
            recs.sort(key=lambda r: r["seed"])
    return out


def _vals(recs: list[Any], what: str = "test") -> list[float]:
    return [float(r[what]) for r in recs]


def _kb(b: float) -> str:
    return f"{b / 1e3:,.1f}"


def _configs(recs: list[Any]) -> str:
    n = Counter(r["config"] for r in recs)
    return "; ".join(f"{c} ({m}/{len(recs)})" if len(n) > 1 else c for c, m in sorted(n.items()))


def _peer_table(cell: dict[tuple[str, ...], list[Any]]) -> str:
    body = []
    for key in sorted((k for k, v in cell.items() if v[0]["family"] == "peer"),
                      key=lambda k: (PEERS.index(cell[k][0]["peer"]), "tuned" in k[0], k)):
        recs = cell[key]
        body.append([key[0], _configs(recs), _kb(min(r["bytes"] for r in recs)),
                     fmt_mean_se(_vals(recs, "val")), fmt_mean_se(_vals(recs)), len(recs)])
    return markdown_table(["peer", "configuration (chosen on validation)", "KB / client",
                           "validation %", "test %", "seeds"], body)


def secure(rec: dict[str, Any]) -> bool:
    """Whether a ghofl record's upload is secure-aggregatable (the server needs only the sum).

    Parts saved before records carried ``secure``: every setting but the FedCOF estimate.
    """
    return bool(rec.get("secure", rec.get("setting") != ESTIMATE))


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no** (every client's means)"


def _ghofl_table(cell: dict[tuple[str, ...], list[Any]]) -> str:
    rows: dict[tuple[int, str, str, bool], dict[str, str]] = {}
    for (m, s, dt), recs in cell.items():
        if recs[0]["family"] == "ghofl":
            key = (recs[0]["bytes"], s, dt, secure(recs[0]))
            rows.setdefault(key, {})[m[6:]] = fmt_mean_se(_vals(recs))
    heads = ("ncm", "lda", "lda (tuned)", "ridge", "ridge (tuned)", "qda", "nb")
    body = [[s, dt, _yes(sec), _kb(b), *(v.get(h, "–") for h in heads)]
            for (b, s, dt, sec), v in sorted(rows.items())]
    return markdown_table(["ghofl upload", "transport", "secure sum", "KB / client",
                           *(f"{h} test %" for h in heads)], body)


def best_at(cell: dict[tuple[str, ...], list[Any]], budget: float, seeds: list[int],
            secure_only: bool = False) -> tuple[str, ...] | None:
    """ghofl's (head, setting, dtype) at ≤ ``budget`` bytes with the best mean validation
    accuracy over ``seeds`` (only those measured at every one of them; with ``secure_only``,
    only secure-aggregatable uploads)."""
    ok = [k for k, recs in cell.items() if recs[0]["family"] == "ghofl"
          and recs[0]["bytes"] <= budget and [r["seed"] for r in recs] == seeds
          and (secure(recs[0]) or not secure_only)]
    return max(ok, key=lambda k: (mean_se(_vals(cell[k], "val"))[0], -cell[k][0]["bytes"], k),
               default=None)


def _verdict_row(cell: dict[tuple[str, ...], list[Any]], key: tuple[str, ...],
                 secure_only: bool) -> list[Any] | None:
    """One verdict row of peer ``key``; ``None`` for a secure-only row that repeats the best."""
    peer = cell[key]
    budget = min(r["bytes"] for r in peer)
    seeds = [r["seed"] for r in peer]
    ours = best_at(cell, budget, seeds, secure_only)
    if secure_only and ours == best_at(cell, budget, seeds):
        return None
    head = [key[0], _kb(budget), fmt_mean_se(_vals(peer))]
    if ours is None:
        return [*head, "none fits" + (" (secure sum)" if secure_only else ""), "", "", "", ""]
    mine = cell[ours]
    word, cmp = decide_lead(_vals(mine), _vals(peer))
    say = {"lead": "ghofl leads", "tie": "tie (within 2 SE)", "behind": "**peer ahead**",
           "undecided": "undecided (< 2 seeds)"}[word]
    return [*head, f"{ours[0][6:]}, {ours[1]}, {ours[2]}", _yes(secure(mine[0])),
            _kb(mine[0]["bytes"]), fmt_mean_se(_vals(mine)), cmp.describe(say, say)]


def _verdict_table(cell: dict[tuple[str, ...], list[Any]]) -> str:
    """Per peer: ghofl's best upload at its bytes and, when that one is not secure-aggregatable,
    also ghofl's best secure one."""
    body = []
    for key in sorted((k for k, v in cell.items() if v[0]["family"] == "peer"),
                      key=lambda k: (PEERS.index(cell[k][0]["peer"]), "tuned" in k[0], k)):
        body += [row for sec in (False, True) if (row := _verdict_row(cell, key, sec))]
    return markdown_table(["peer", "its KB / client", "peer test %",
                           "ghofl at ≤ those bytes (chosen on validation)", "secure sum",
                           "KB / client", "ghofl test %", "ghofl − peer"], body)


def render(data: dict[str, Any]) -> str:
    parts = data.get("parts", {})
    cells = _cells(parts)
    blocks = []
    for ds in sorted({d for d, _ in cells}):
        first = next(p for _, p in sorted(parts.items()) if p["dataset"] == ds)
        lines = [f"### {ds} — {first['encoder']}, C = {first['classes']}, d = {first['dim']}, "
                 f"{first['n_train']:,} train / {first['n_test']:,} test"]
        for k in sorted((k for d, k in cells if d == ds), reverse=True):
            cell = cells[(ds, k)]
            lines += [f"**K = {k}, α = {ALPHA}**", _peer_table(cell), _ghofl_table(cell),
                      _verdict_table(cell)]
        if not data.get("subset"):
            lines.append(f"![{ds}: accuracy vs bytes per client]"
                         f"(benchmarks/results/peers_{ds}.png)")
        blocks.append("\n\n".join(lines))
    return _text(data, parts, blocks)


def _text(data: dict[str, Any], parts: dict[str, Any], blocks: list[str]) -> str:
    machines = sorted({str(p["machine"]) for p in parts.values() if p.get("machine")})
    dates = sorted({str(p.get("date", "?")) for p in parts.values()})
    secs = [sum(p.get("seconds", {}).values()) for p in parts.values()]
    return "\n".join([
        "## The peers side by side (`benchmarks/bench_peers.py`)",
        "",
        "Identical features per data set; Dirichlet label skew α = 0.1, each seed its own "
        "partition (a client the draw leaves without rows uploads nothing; their number is in "
        "each part); statistics streamed client by client into running totals (FedCOF keeps "
        "each client's class counts and sums, what its estimator needs). Every method is fitted "
        "on 90 % of each client's rows and scored on the other 10 % (validation), then refitted "
        "on all rows for the test score. Peers: FedNCM (`ncm`, cosine); Fed3R as shipped "
        "(FedCOF repository: float32 pseudo-inverse of G + λI, PyTorch's default cutoff, λ = "
        "0.01, no intercept, normalised weights) and tuned (the best on validation of that "
        f"solver at λ ∈ {{{', '.join(f'{v:g}' for v in FED3R_LAMBDAS)}}} and of an intercept "
        "(features augmented by 1) with a float64 Cholesky solve, normalised or raw weights); "
        f"FedCOF (`fedcof` on its estimate from the clients' means) at γ = 1 and tuned, γ ∈ "
        f"{{{', '.join(f'{v:g}' for v in FEDCOF_GAMMAS)}}}. Peers' bytes: float64 uploads "
        "(symmetric matrices as upper triangles). ghofl: default heads, `ncm` on `means` "
        "(FedNCM's classifier on the securely summed class sums and counts), naive Bayes on "
        "`diag`, LDA / ridge on `pooled` (also *tuned*, as the peers are: the coefficient "
        "chosen on validation among the default and "
        f"{{{', '.join(f'{v:g}' for v in TUNED['lda'][1])}}} (LDA shrinkage) or "
        f"{{{', '.join(f'{v:g}' for v in TUNED['ridge'][1])}}} (ridge a)), QDA on `full` "
        "(C·d² ≤ 1e8), LDA / ridge on `gram` of public projections at the largest k fitting "
        "each peer's bytes, float64 and float32 transport; and LDA / "
        f"ridge (QDA where C·d² ≤ 1e8) on `{ESTIMATE}`: FedCOF's covariance estimate "
        "(`ghofl.moments.fedcof.fedcof_statistics`, `ghofl aggregate --estimate fedcof`) from "
        "the same means-only upload as FedCOF, so the same bytes, the heads' data-driven "
        "shrinkage reading the estimate's degrees of freedom. Like FedCOF, that setting shows "
        "the server every client's class means: it cannot run under secure aggregation, "
        "whereas every other ghofl upload is a sum the server may receive only summed over the "
        "clients (column 'secure sum'; where ghofl's best at a peer's bytes is not secure, a "
        "second row gives its best secure one). At each peer's bytes (the smallest over the "
        "seeds) ghofl's head and upload are chosen on validation (mean over the seeds), never "
        "on test. Cells: test accuracy, mean ± standard "
        "error over the seeds; verdicts by `ghofl.bench.peers.decide_lead`: a lead or a "
        "shortfall counts only beyond 2 standard errors of the difference (`ghofl.bench."
        "decide`), else a tie; one seed: undecided. Parts: `benchmarks/results/peers/`.",
        "",
        *(b + "\n" for b in blocks),
        f"Machine: {'; '.join(machines) or '–'}. Measured {', '.join(dates) or '–'}"
        f"{' (subset: not written)' if data.get('subset') else ''}: {len(parts)} parts, "
        f"{sum(secs) / 60:.0f} min in all, the slowest {max(secs, default=0.0) / 60:.1f} min.",
    ])


def plot(data: dict[str, Any], results_dir: Path) -> None:
    """``peers_<data set>.png``: test accuracy vs bytes per client, one panel per K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = _cells(data.get("parts", {}))
    for ds in sorted({d for d, _ in cells}):
        ks = sorted((k for d, k in cells if d == ds), reverse=True)
        fig, axes = plt.subplots(1, len(ks), figsize=(6.5 * len(ks), 4.5), squeeze=False)
        for ax, k in zip(axes[0], ks, strict=True):
            for (m, _s, dt), recs in sorted(cells[(ds, k)].items()):
                acc = 100 * mean_se(_vals(recs))[0]
                b = recs[0]["bytes"]
                if recs[0]["family"] == "peer":
                    ax.scatter([b], [acc], marker="*", s=140, zorder=3, label=m)
                else:
                    colour = (("tab:blue", "tab:orange") if secure(recs[0])
                              else ("black", "tab:gray"))[dt != "float64"]
                    ax.scatter([b], [acc], s=14, alpha=0.7,
                               marker={"ncm": "D", "lda": "o", "ridge": "s", "qda": "^",
                                       "nb": "x"}[m[6:].split()[0]],
                               color=colour)
            ax.set_xscale("log")
            ax.legend(fontsize=7, loc="lower right")
            ax.set_xlabel("bytes per client")
            ax.set_ylabel("test accuracy (%)")
            ax.set_title(f"{ds}, K = {k}: ghofl (◇ ncm, o lda, □ ridge, △ qda, x nb; blue / orange "
                         "float64 / float32 sums,\nblack / grey float64 / float32 means on the "
                         "FedCOF estimate) and peers (★)", fontsize=8)
        fig.tight_layout()
        fig.savefig(results_dir / f"peers_{ds}.png", dpi=110)
        plt.close(fig)


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(RESULTS, RESULTS, render, load=load_parts, after_render=plot),),
    measure=measure,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
