"""Personalisation with no extra communication (issue 42): each client's accuracy on its own mix.

Data: CIFAR-10 (EfficientNet-Lite0 at 224 px) and AG News (all-MiniLM-L6-v2), embedded once
through the cache the other benchmarks use (:func:`ghofl.bench.features.load_features`). Each
part is one data set x one number of clients (10, 100); in a part, for each Dirichlet α of
``--alphas`` and each partition seed of ``--seeds``, the training set is split among the
clients (:func:`~ghofl.data.partition.dirichlet_partition`) and the global model is fitted from
the sum of the clients' ``full`` statistics (lda, ``ghofl fit``'s default head without a held-out
section, and qda, both with their default hyperparameters).

Each client's test set is drawn from the test set with the client's own class mix: with n_c
its training rows of class c (n in all) and a_c the test rows of class c, it holds
m = min(n, ``TEST_CAP``, min over the client's classes of ⌊a_c n / n_c⌋) rows, t_c =
round(m n_c / n) of class c drawn without replacement (seeded by the partition seed and the
client). Methods, each scored by its accuracy on every client's test set:

* global lda / qda: the global heads;
* local priors lda / qda: the same heads with the client's priors
  (:func:`ghofl.model.personalize.personalize_heads`, ``priors=True``: (n_c + 1)/Σ(n_k + 1));
* local classes lda / qda: the client's priors without pseudo-count (n_c / n): a class the
  client never held is never predicted (``pseudocount=0``);
* moments qda: also the client's class Gaussians mixed with the global ones, weight
  n_c / (n_c + κ), κ = :data:`~ghofl.model.personalize.DEFAULT_KAPPA` (``moments=True``), and
  the same with κ = d (the dimension of the features);
* local only: scikit-learn ``LogisticRegression(C=LOGREG_C)`` (lbfgs) on the client's own
  training rows (a client holding one class predicts it);
* FedAvg and FedAvg + fine-tuning: FedAvg of a linear softmax head on the same features
  (:func:`ghofl.baselines.fedavg_rounds`, ``FEDAVG_ROUNDS`` rounds of one local epoch, batch 64,
  learning rate chosen from ``LR_GRID`` by FedAvg on 90 % of each client's rows scored on the
  other 10 %), then ``FT_EPOCHS`` epochs of SGD on the client's own rows at the same rate.

Per method: the mean and the 10th percentile over clients of the per-client accuracy, each
averaged over the seeds (± standard error over seeds). Beside them, the federated evaluation
(:mod:`ghofl.evaluation.federated`: every client's sums on its test set, added, reported) of
the global and the personalised heads, and the global heads' central accuracy on the whole
test set.

Writes benchmarks/results/personalize.json (after every α x seed, so an interrupted part
resumes where it stopped) and the ``personalize`` section of BENCHMARKS.md. Run:
``.venv/bin/python benchmarks/bench_personalize.py [--datasets cifar10] [--clients 10]``
(needs ``GHOFL_DATA_DIR`` or ../shared/data); ``--quick`` runs small subsets, one seed, and
writes nothing (a check that the script runs); ``--report-only`` rewrites the section.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.baselines.fedavg import fedavg_rounds, local_sgd, softmax_accuracy
from ghofl.bench import harness
from ghofl.bench.decide import paired_lead
from ghofl.bench.provenance import CODE_KEY
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.data.partition import dirichlet_partition
from ghofl.errors import ConfigError
from ghofl.evaluation.federated import EvaluationSums, local_evaluation, report
from ghofl.heads import make_head
from ghofl.model.fine_tune import DEFAULT_TAU, fine_tune_heads
from ghofl.model.personalize import DEFAULT_KAPPA, personalize_heads
from ghofl.server.default_head import choose_default_head
from ghofl.stats import compute_stats

ENCODERS = {"cifar10": "efficientnet-lite0", "agnews": "minilm", "trec": "minilm",
            "sst2": "minilm"}
TEST_CAP = 1000
LOGREG_C = 1.0
FEDAVG_ROUNDS = 100
LR_GRID = (0.01, 0.03, 0.1)
LR_ROUNDS = 10
FT_EPOCHS = 5
#: Fewest training rows of a client in a partition.
MIN_PER_CLIENT = 2
METHODS = ("global lda", "global qda", "local priors lda", "local priors qda",
           "local classes lda", "local classes qda", "moments qda", "moments qda (kappa=d)",
           "fine-tuned lda", "local only", "fedavg", "fedavg + fine-tune")
PERSONAL = ("local priors lda", "local priors qda", "local classes lda", "local classes qda",
            "moments qda", "moments qda (kappa=d)", "fine-tuned lda")
QUICK = {"datasets": "cifar10,agnews", "clients": "10", "alphas": "0.1,10", "seeds": "0",
         "train_per_class": 60, "test_per_class": 40, "rounds": 5}
I64 = NDArray[np.int64]


def _add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true",
                    help="Small subsets, one seed, α 0.1 and 10, 10 clients; writes nothing.")
    ap.add_argument("--datasets", default="cifar10,agnews", help="Comma-separated data sets.")
    ap.add_argument("--clients", default="10,100", help="Comma-separated numbers of clients.")
    ap.add_argument("--alphas", default="0.05,0.1,0.5,10", help="Dirichlet concentrations.")
    ap.add_argument("--seeds", default="0,1,2", help="Partition seeds.")
    ap.add_argument("--resolution", type=int, default=224, help="Image encoder input size.")
    ap.add_argument("--train-per-class", type=int, default=0,
                    help="Training rows per class (0: the whole split).")
    ap.add_argument("--test-per-class", type=int, default=0,
                    help="Test rows per class (0: the whole split).")
    ap.add_argument("--rounds", type=int, default=FEDAVG_ROUNDS, help="FedAvg rounds.")


def client_test_rows(y_test: I64, counts: NDArray[Any], cap: int,
                     rng: np.random.Generator) -> I64:
    """Rows of the test set with the client's class mix (the module docstring's rule).

    Parameters
    ----------
    y_test : ndarray of int, shape (N,)
        Labels of the test set.
    counts : ndarray of int, shape (C,)
        The client's training rows per class n_c.
    cap : int
        At most this many rows.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray of int, shape (m',)
        Indices into the test set, m' = Σ_c t_c.
    """
    n_c = np.asarray(counts, dtype=np.float64)
    avail = np.bincount(y_test, minlength=n_c.size).astype(np.float64)
    n = n_c.sum()
    held = n_c > 0
    m = min(n, float(cap), float(np.min(np.floor(avail[held] * n / n_c[held]))))
    take = np.minimum(np.round(m * n_c / n).astype(np.int64), avail.astype(np.int64))
    rows = [rng.choice(np.flatnonzero(y_test == c), size=int(t), replace=False)
            for c, t in enumerate(take) if t > 0]
    return np.sort(np.concatenate(rows)).astype(np.int64)


def _local_only(x: Any, y: I64, c: int) -> Any:
    """Predict function of the client's own logistic regression (one class: that class)."""
    from sklearn.linear_model import LogisticRegression

    held = np.unique(y)
    if held.size == 1:
        return lambda rows: np.full(rows.shape[0], held[0])
    model = LogisticRegression(C=LOGREG_C, max_iter=1000).fit(x, y)
    return model.predict


def _fedavg(x: Any, y: I64, parts: list[I64], c: int, rounds: int, seed: int
            ) -> tuple[Any, float]:
    """FedAvg's global weights and the learning rate chosen on the clients' held-out tenth."""
    rng = np.random.default_rng(seed)
    fit, held = [], []
    for idx in parts:
        idx = rng.permutation(idx)
        cut = idx.size // 10
        held.append(idx[:cut])
        fit.append(idx[cut:])
    h = np.concatenate(held)
    scores = {lr: softmax_accuracy(fedavg_rounds(x, y, fit, c, rounds=min(LR_ROUNDS, rounds),
                                                 lr=lr, seed=seed), x[h], y[h])
              for lr in LR_GRID}
    lr = max(LR_GRID, key=lambda v: scores[v])
    return fedavg_rounds(x, y, parts, c, rounds=rounds, lr=lr, seed=seed), lr


def _percentile10(v: list[float]) -> float:
    return float(np.percentile(np.asarray(v), 10))


def run_seed(f: Any, k: int, alpha: float, seed: int, rounds: int) -> dict[str, Any]:
    """Every method on one partition; per method the per-client accuracies' mean and p10.

    A (K, α) that no Dirichlet partition can give every client :data:`MIN_PER_CLIENT` rows
    (few classes, many clients, small α) gives ``{"infeasible": reason}``: recorded, shown
    in the section, never averaged.
    """
    t0 = time.perf_counter()
    x, y = np.asarray(f.x_train, np.float64), f.y_train
    xt, yt = np.asarray(f.x_test, np.float64), f.y_test
    c = len(f.classes)
    try:
        parts = dirichlet_partition(y, k, alpha, seed, min_per_client=MIN_PER_CLIENT)
    except ConfigError as exc:
        return {"clients": k, "alpha": alpha, "seed": seed, "infeasible": str(exc)}
    every = np.concatenate(parts)  # the sum of the clients' statistics
    total = compute_stats(x[every], y[every], f.classes, mode="full", encoder=f.encoder_info)
    glob = {n: make_head(n).fit_from_stats(total) for n in ("lda", "qda")}
    default, _ = choose_default_head(total, glob, {}, seed)
    central = {n: float(np.mean(h.predict(xt) == yt)) for n, h in glob.items()}
    pool = {n: h.predict(xt) for n, h in glob.items()}
    fed, lr = _fedavg(x, y, parts, c, rounds, seed)
    acc: dict[str, list[float]] = {m: [] for m in METHODS}
    sums: dict[str, list[EvaluationSums]] = {"global": [], "personalised": []}
    cache: dict[str, Any] = {}
    rng = np.random.default_rng([seed, 42])
    for i, idx in enumerate(parts):
        local = compute_stats(x[idx], y[idx], f.classes, mode="full", encoder=f.encoder_info)
        rows = client_test_rows(yt, local.counts, TEST_CAP, rng)
        xr, yr = xt[rows], yt[rows]
        pri, _ = personalize_heads(glob, total.counts, local)
        only, _ = personalize_heads(glob, total.counts, local, pseudocount=0.0)
        mom, _ = personalize_heads({"qda": glob["qda"]}, total.counts, local, moments=True,
                                   cache=cache)
        mom_d, _ = personalize_heads({"qda": glob["qda"]}, total.counts, local, moments=True,
                                     kappa=float(x.shape[1]), cache=cache)
        tuned = fine_tune_heads({"lda": glob["lda"]}, total.counts, x[idx], y[idx])[0]["lda"]
        ft = local_sgd(fed, x[idx], y[idx], epochs=FT_EPOCHS, lr=lr, batch_size=64,
                       rng=np.random.default_rng([seed, i]))
        preds = {"global lda": pool["lda"][rows], "global qda": pool["qda"][rows],
                 "local priors lda": pri["lda"].predict(xr),
                 "local priors qda": pri["qda"].predict(xr),
                 "local classes lda": only["lda"].predict(xr),
                 "local classes qda": only["qda"].predict(xr),
                 "moments qda": mom["qda"].predict(xr),
                 "moments qda (kappa=d)": mom_d["qda"].predict(xr),
                 "fine-tuned lda": tuned.predict(xr),
                 "local only": _local_only(x[idx], y[idx], c)(xr)}
        for m, p in preds.items():
            acc[m].append(float(np.mean(p == yr)))
        acc["fedavg"].append(softmax_accuracy(fed, xr, yr))
        acc["fedavg + fine-tune"].append(softmax_accuracy(ft, xr, yr))
        sums["global"].append(local_evaluation(glob, xr, yr))
        sums["personalised"].append(local_evaluation({"lda": tuned, "qda": mom["qda"]}, xr, yr))
    fed_eval = {k2: report(sum(v[1:], v[0])) for k2, v in sums.items()}
    return {"clients": k, "alpha": alpha, "seed": seed, "default_head": default, "lr": lr,
            "central": central, "seconds": time.perf_counter() - t0,
            "methods": {m: {"mean": float(np.mean(v)), "p10": _percentile10(v)}
                        for m, v in acc.items()},
            "federated": {k2: {h: {key: r[key] for key in ("accuracy", "client_accuracy_mean",
                                                           "client_accuracy_std", "n")}
                               for h, r in rep.items()} for k2, rep in fed_eval.items()}}


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("datasets", "clients", "alphas", "seeds", "train_per_class", "test_per_class",
            "rounds")
    if args.quick:
        args.no_write = True  # a check that the script runs, not a result
        return dict(QUICK)
    return {k: getattr(args, k) for k in keys}


def _features(name: str, s: dict[str, Any], resolution: int, data_dir: str | None) -> Any:
    from ghofl.bench.config import ExperimentConfig
    from ghofl.bench.features import load_features

    enc = ENCODERS.get(name, "efficientnet-lite0")
    cfg = ExperimentConfig(datasets=(name,), encoders=(enc,), resolution=resolution,
                           backend="onnx", data_dir=data_dir,
                           train_per_class=int(s["train_per_class"]),
                           test_per_class=int(s["test_per_class"]))
    return load_features(name, enc, cfg, progress=False, log=print)


def _mean_se(v: list[float]) -> dict[str, float]:
    se = statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else 0.0
    return {"mean": float(statistics.fmean(v)), "se": float(se), "n": float(len(v))}


def _method_cells(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method measured in any run: mean ± SE over the runs that have it (mean and p10)."""
    out: dict[str, Any] = {}
    for m in METHODS:
        have = [r["methods"][m] for r in rs if m in r["methods"]]
        if have:
            out[m] = {q: _mean_se([v[q] for v in have]) for q in ("mean", "p10")}
    return out


def summarise(runs: dict[str, Any]) -> dict[str, Any]:
    """Per α: per method the mean ± SE over seeds of the clients' mean and 10th percentile."""
    by_alpha: dict[str, list[dict[str, Any]]] = {}
    for r in runs.values():
        if "infeasible" not in r:
            by_alpha.setdefault(f"{r['alpha']:g}", []).append(r)
    out: dict[str, Any] = {}
    for a, rs in sorted(by_alpha.items(), key=lambda kv: float(kv[0])):
        out[a] = {"seeds": len(rs), "methods": _method_cells(rs),
                  "per_seed": {m: [r["methods"][m]["mean"] for r in rs if m in r["methods"]]
                               for m in METHODS},
                  "per_run": [{m: v["mean"] for m, v in r["methods"].items()} for r in rs],
                  "central": {h: _mean_se([r["central"][h] for r in rs]) for h in ("lda", "qda")},
                  "federated": {kind: {h: {key: _mean_se([r["federated"][kind][h][key]
                                                          for r in rs])
                                           for key in ("accuracy", "client_accuracy_mean",
                                                       "client_accuracy_std")}
                                       for h in ("lda", "qda")}
                                for kind in ("global", "personalised")}}
    return out


def _complete(runs: dict[str, Any]) -> dict[str, Any]:
    """The saved runs that measured every method (a run lacking one is measured again)."""
    return {k: r for k, r in runs.items()
            if "infeasible" in r or set(METHODS) <= set(r["methods"])}


def measure(ctx: harness.Context) -> dict[str, Any]:
    args = ctx.args
    s = _settings(args)
    data_dir = ctx.data_dir()
    saved = ctx.load("personalize.json", {}) if not args.quick else {}
    result: dict[str, Any] = {"machine": machine_summary(), "date": time.strftime("%Y-%m-%d"),
                              "quick": args.quick, "parts": dict(saved.get("parts", {})),
                              "rules": {"test_cap": TEST_CAP, "logreg_C": LOGREG_C,
                                        "kappa": DEFAULT_KAPPA, "tau": DEFAULT_TAU,
                                        "fedavg_rounds": s["rounds"],
                                        "lr_grid": list(LR_GRID), "ft_epochs": FT_EPOCHS}}
    alphas = [float(v) for v in str(s["alphas"]).split(",")]
    seeds = [int(v) for v in str(s["seeds"]).split(",")]
    for name in str(s["datasets"]).split(","):
        f = _features(name, s, args.resolution, data_dir)
        for k in (int(v) for v in str(s["clients"]).split(",")):
            key = f"{name}/{k}"
            part = dict(result["parts"].get(key, {}))
            part["load_start"] = os.getloadavg()[0]
            earlier = dict(part.get("runs", {}))  # kept unless measured again
            part.update({"dataset": name, "clients": k, "encoder": f.encoder_name,
                         "n_train": int(f.y_train.size), "n_test": int(f.y_test.size)})

            def save(runs: dict[str, Any], key: str = key, part: dict[str, Any] = part,
                     earlier: dict[str, Any] = earlier) -> None:
                every = {**earlier, **runs}
                # runs kept from an earlier run keep its code record (or none) until
                # every one of them is measured again
                code = ctx.code_version() if set(earlier) <= set(runs) else part.get(CODE_KEY)
                part.update({"runs": every, "load_end": os.getloadavg()[0],
                             "summary": summarise(every), CODE_KEY: code})
                result["parts"][key] = part
                ctx.save("personalize.json", result)

            def one(row: tuple[float, int], k: int = k, f: Any = f) -> dict[str, Any]:
                r = run_seed(f, k, row[0], row[1], int(s["rounds"]))
                if "infeasible" in r:
                    ctx.log(f"  {f.dataset} K={k} α={row[0]:g} seed {row[1]}: no partition "
                            f"({r['infeasible']})")
                    return r
                ctx.log(f"  {f.dataset} K={k} α={row[0]:g} seed {row[1]}: " + ", ".join(
                    f"{m} {100 * v['mean']:.1f}" for m, v in r["methods"].items())
                    + f" ({r['seconds']:.0f} s)")
                return r

            runs = harness.run_rows([(a, sd) for a in alphas for sd in seeds],
                                    lambda row: f"alpha={row[0]:g}/seed={row[1]}", one,
                                    done=_complete(part.get("runs", {})), save=save)
            save(runs)
    return {"personalize": result}


def _cell(v: dict[str, float]) -> str:
    return f"{100 * v['mean']:.1f} ± {100 * v['se']:.1f}"


def _compare(summ: dict[str, Any], best: str, other: str) -> str:
    """``best`` against ``other`` on the partitions both ran (paired, the two-SE rule).

    Every method of a run scores the same clients on the same test rows, so the comparison is
    paired (:func:`ghofl.bench.decide.paired_lead`): the per-partition differences, their mean
    ± standard error; a decided lead when the mean exceeds two standard errors.
    """
    runs = [r for r in summ.get("per_run", []) if best in r and other in r]
    if not runs:
        return f"{other} not measured"
    d = paired_lead([r[best] for r in runs], [r[other] for r in runs])
    if d.passed is None:
        return f"{d.diff:+.1f} point(s) against {other} (one seed: undecided)"
    lead = ("a decided lead" if d.passed else "above, within 2 SE" if d.diff > 0
            else "tied" if d.diff == 0 else "BELOW")
    return (f"{d.diff:+.1f} ± {d.se:.1f} point(s) against {other} (paired over {len(runs)} "
            f"partitions: {lead})")


def _verdict(summ: dict[str, Any]) -> str:
    """The issue's bar on CIFAR-10 with 10 clients, from the part's summary."""
    lines = []
    low = summ.get("0.1")
    if low is not None:
        m = low["methods"]
        best = max((n for n in PERSONAL if n in m), key=lambda n: m[n]["mean"]["mean"])
        said = "; ".join(_compare(low, best, o)
                         for o in ("global lda", "local only", "fedavg + fine-tune"))
        above = all(statistics.fmean(low["per_seed"][best]) > statistics.fmean(
            low["per_seed"][o]) for o in ("global lda", "local only", "fedavg + fine-tune"))
        p10 = m[best]["p10"]["mean"] >= m["global lda"]["p10"]["mean"]
        lines.append(f"α = 0.1: best personalised head {best} ({_cell(m[best]['mean'])} %): "
                     f"{said} (the bar: above all three, {'met' if above else 'NOT met'}); its "
                     f"10th percentile {'is not below' if p10 else 'is BELOW'} global lda's.")
    high = summ.get("10")
    if high is not None:
        m = high["methods"]
        best = max((n for n in PERSONAL if n in m), key=lambda n: m[n]["mean"]["mean"])
        cost = 100 * (m["global lda"]["mean"]["mean"] - m[best]["mean"]["mean"])
        said = f"costs {cost:.2f} point(s)" if cost > 0 else f"gains {-cost:.2f} point(s)"
        lines.append(f"α = 10: {best} {said} against global lda "
                     f"({'within' if cost <= 0.3 else 'ABOVE'} the 0.3-point bound on the cost).")
    return " ".join(lines)


def _personal_lda(v: dict[str, Any]) -> str:
    """Which lda the federated report of the personalised heads scored at this α.

    Runs measured before the fine-tuning existed scored the lda with local priors.
    """
    tuned = len(v.get("per_seed", {}).get("fine-tuned lda", []))
    if tuned == v["seeds"]:
        return "fine-tuned lda"
    return "local priors lda" if tuned == 0 else "personalised lda (fine-tuned in " \
        f"{tuned} of {v['seeds']} seeds, local priors in the others)"


def _part_text(key: str, part: dict[str, Any]) -> str:
    summ = summarise(part["runs"]) if part.get("runs") else part.get("summary", {})
    rows = []
    for a, v in summ.items():
        rows.append([a, v["seeds"], *(f"{_cell(v['methods'][m]['mean'])} / "
                                      f"{100 * v['methods'][m]['p10']['mean']:.1f}"
                                      if m in v["methods"] else "—" for m in METHODS)])
    table = markdown_table(["α", "seeds", *METHODS], rows)
    fed = []
    for a, v in summ.items():
        g, p = v["federated"]["global"]["lda"], v["federated"]["personalised"]
        fed.append(f"α = {a}: central lda {_cell(v['central']['lda'])} %, qda "
                   f"{_cell(v['central']['qda'])} %; federated report, global lda "
                   f"{_cell(g['accuracy'])} % (clients {_cell(g['client_accuracy_mean'])} ± "
                   f"{100 * g['client_accuracy_std']['mean']:.1f} %), {_personal_lda(v)} "
                   f"{_cell(p['lda']['accuracy'])} %, moments qda {_cell(p['qda']['accuracy'])} %")
    load = f"load average {part.get('load_start', 0):.2f} at the start, " \
           f"{part.get('load_end', 0):.2f} at the end"
    head = (f"### {part['dataset']}, {part['clients']} clients ({part['encoder']}, "
            f"{part['n_train']:,} training / {part['n_test']:,} test rows; {load})")
    skipped: dict[str, list[str]] = {}
    for r in part.get("runs", {}).values():
        if "infeasible" in r:
            skipped.setdefault(f"{r['alpha']:g}", []).append(str(r["seed"]))
    for a in sorted(skipped, key=float):
        fed.append(f"α = {a}, seed(s) {', '.join(sorted(skipped[a], key=int))}: not run: no "
                   f"Dirichlet partition of the {part['n_train']:,} training rows gives each of "
                   f"the {part['clients']} clients {MIN_PER_CLIENT} rows or more (every client "
                   "must hold some data)")
    verdict = _verdict(summ) if key == "cifar10/10" else ""
    return "\n\n".join(x for x in (head, table, "\n".join(f"- {t}" for t in fed), verdict) if x)


def render(r: dict[str, Any]) -> str:
    rules = r["rules"]
    parts = harness.in_order(r["parts"], [f"{d}/{k}" for d in ("cifar10", "agnews")
                                          for k in (10, 100)])
    body = "\n\n".join(_part_text(k, p) for k, p in parts.items())
    return (
        "## Personalisation with no extra communication (`benchmarks/bench_personalize.py`)"
        "\n\nPer-client accuracy (%) on a test set drawn with each client's own class mix "
        f"(at most {rules['test_cap']} rows a client): the mean over clients ± its standard "
        "error over the partition seeds, then the 10th-percentile client. Global: the heads "
        "fitted from the sum of the clients' statistics (lda is the model's default head); "
        "local priors: the same with the client's class priors (n_c + 1)/Σ(n_k + 1); local "
        "classes: priors n_c/n (classes the client never held are never predicted); moments "
        f"qda: also the client's class Gaussians, weight n_c/(n_c + {rules['kappa']:g}), and "
        "n_c/(n_c + d) with d the feature dimension; local "
        f"only: logistic regression (C = {rules['logreg_C']:g}) on the client's rows; FedAvg: "
        f"{rules['fedavg_rounds']} rounds of a linear softmax head on the same features, then "
        f"{rules['ft_epochs']} epochs of fine-tuning on the client's rows; fine-tuned lda: "
        "the global lda over the client's classes with its priors, then the logistic "
        "regression on the client's rows pulled towards it, penalty "
        f"(τ/2)‖θ − θ_lda‖², τ = {rules.get('tau', 100):g} (`ghofl personalize --embeddings`, "
        "ghofl.model.fine_tune). Nothing of the "
        "personalisation leaves the client. Verdicts compare two methods on the partitions "
        "both ran (every method of a run scores the same clients on the same rows): the mean "
        "± standard error of the per-partition differences, a decided lead when it exceeds "
        "two standard errors (`ghofl.bench.decide.paired_lead`). "
        f"Machine: {r['machine']}. Measured {r['date']}.\n\n{body}\n"
    )


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("personalize", "personalize.json", render),),
    measure=measure,
    add_arguments=_add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
