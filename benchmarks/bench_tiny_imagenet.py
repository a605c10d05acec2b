"""Tiny-ImageNet-200 at C = 200, d = 1280: every head within memory, with bytes, memory and time.

One federation per upload configuration (10 clients, α = 0.1, seed 0, EfficientNet-Lite0 at
224 px, 20,000 training and 10,000 test images), each in a fresh process so that its memory
peaks are its own:

* ``full``: per-class second moments S_c at d = 1280 (1.31 GB per client on the wire);
* ``full`` with a public random projection to k = 512 and k = 256 (S_z in z-space, so QDA
  still works);
* ``pooled``: per-class diagonals and one global B (every head but QDA).

Per configuration it reports the bytes one client uploads (float64 and float32 transport, the
array data of :func:`ghofl.stats.payload_nbytes`), the seconds of the clients, of the streaming
aggregation (clients made one at a time, each payload added to the total and dropped, as the
plain protocol and ``ghofl aggregate`` do) and of one untrusted load of a payload file
(``load_stats``: digest, layout and every validity check, PSD included), the server's peak
memory above the process baseline (resident set size, sampled every 5 ms; the baseline holds
the embeddings), and per head the fit and predict seconds, the peak memory of the fit and the
test accuracy. The server's addition is measured both ways in the same run: in place
(:class:`ghofl.stats.client_stats.StatsTotal`, what the server paths use) for payloads 1 to 9,
and the old pairwise ``total + payload`` for the last one.

Run: ``flock scratch/cpu.lock .venv/bin/python benchmarks/bench_tiny_imagenet.py`` (needs the
Tiny-ImageNet embedding cache or ``GHOFL_DATA_DIR`` to compute it: about 6 minutes on 2 cores).
``--configs pooled,full-k256`` runs a subset; ``--heads`` and ``--skip full:nb,full:lda``
re-run some heads of a configuration: its other head rows are kept from the JSON with the date
they were measured (the upload and aggregation columns are always re-measured); ``--render``
(or ``--report-only``) rewrites the section from the JSON. Writes
``benchmarks/results/tiny_imagenet_scale.json`` and the section ``tiny-imagenet-scale`` of
BENCHMARKS.md; the notes under it read the main table, the centralised probe and the trainable
heads from ``benchmarks/results/tiny_imagenet/`` and ``benchmarks/results/tiny_imagenet_trained/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ghofl.bench import harness

ROOT = Path(__file__).resolve().parents[1]
SECTION = "tiny-imagenet-scale"
RESULTS = ROOT / "benchmarks" / "results" / "tiny_imagenet_scale.json"
HEADS = ("nb", "lda", "qda", "fedcgs", "fishermix", "protohyper")
#: name -> (mode, projection k or 0)
CONFIGS: dict[str, tuple[str, int]] = {
    "full": ("full", 0),
    "full-k512": ("full", 512),
    "full-k256": ("full", 256),
    "pooled": ("pooled", 0),
}
CLIENTS, ALPHA, SEED = 10, 0.1, 0
#: QDA's ``shrinkage_target`` values, as the notes describe them
QDA_TARGET_WORDS = {
    "pooled": "the default LDA's pooled covariance rescaled to the class",
    "scaled_identity": "tr(Σ_c)/d·I",
    "identity": "I",
}


class RssSampler:
    """Peak resident set size of this process, sampled every ``period`` seconds in a thread."""

    def __init__(self, period: float = 0.005) -> None:
        self.period = period
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        """Current resident set size in bytes (``/proc/self/statm``)."""
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, self.now())

    def reset(self) -> int:
        """Start a new peak window; return the current RSS."""
        cur = self.now()
        self.peak = cur
        return cur

    def window_peak(self) -> int:
        self.peak = max(self.peak, self.now())
        return self.peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def load_tiny_features() -> Any:
    from ghofl.bench.config import ExperimentConfig
    from ghofl.bench.features import load_features

    cfg = ExperimentConfig(datasets=("tiny-imagenet",), encoders=("efficientnet-lite0",))
    return load_features("tiny-imagenet", "efficientnet-lite0", cfg)


def worker(name: str, heads: tuple[str, ...]) -> dict[str, Any]:
    """Measure one configuration in this process (called in a fresh subprocess).

    What is measured so far is also kept in ``<results>.<name>.partial.json`` after every
    stage, so an interrupted configuration keeps its finished rows."""
    import numpy as np

    from ghofl.bench.report import machine_summary
    from ghofl.client.job import ClientJob, client_statistics
    from ghofl.data.partition import dirichlet_partition
    from ghofl.server.job import ServerJob, run_server_job
    from ghofl.stats.client_stats import ClientStats, StatsTotal
    from ghofl.stats.codec import load_stats, payload_nbytes, save_stats

    mode, k = CONFIGS[name]
    feats = load_tiny_features()
    job = ClientJob(classes=feats.classes, mode=mode, projection_dim=k or None)  # type: ignore[arg-type]
    parts = dirichlet_partition(feats.y_train, CLIENTS, ALPHA, SEED)
    sampler = RssSampler()
    base = sampler.reset()
    out: dict[str, Any] = {"config": name, "mode": mode, "projection_dim": k or None,
                           "clients": CLIENTS, "alpha": ALPHA, "seed": SEED,
                           "dim": int(feats.x_train.shape[1]), "classes": len(feats.classes),
                           "n_train": int(feats.y_train.size), "n_test": int(feats.y_test.size),
                           "baseline_rss_bytes": base, "date": time.strftime("%Y-%m-%d"),
                           "machine": machine_summary()}
    client_s: list[float] = []
    acc = StatsTotal()
    inplace_s: list[float] = []
    inplace_extra: list[int] = []
    inplace_server: list[int] = []
    agg_peak = base
    total: ClientStats | None = None
    t_all = time.perf_counter()
    for i, idx in enumerate(parts):
        t0 = time.perf_counter()
        s = client_statistics((feats.x_train[idx], feats.y_train[idx]), job,
                              encoder_info=feats.encoder_info)
        client_s.append(time.perf_counter() - t0)
        if i == 0:
            out["upload_bytes_float64"] = payload_nbytes(s)
            out["upload_bytes_float32"] = payload_nbytes(s, "float32")
            out["payload_in_memory_bytes"] = sum(
                a.nbytes for a in s.arrays().values() if a is not None)
            with tempfile.TemporaryDirectory(dir=os.environ.get("GHOFL_BENCH_TMP")) as tmp:
                path = Path(tmp) / "client.ghs"
                out["file_bytes"] = save_stats(s, path)
                agg_peak = sampler.window_peak()
                rss = sampler.reset()
                t0 = time.perf_counter()
                loaded = load_stats(path)
                out["load_validate_seconds"] = time.perf_counter() - t0
                out["load_peak_extra_bytes"] = sampler.window_peak() - rss
                del loaded
            sampler.reset()
        agg_peak = max(agg_peak, sampler.window_peak())
        if i < len(parts) - 1:  # the server's in-place addition (StatsTotal)
            rss = sampler.reset()
            t0 = time.perf_counter()
            acc.add(s)
            inplace_s.append(time.perf_counter() - t0)
            peak = sampler.window_peak()
            if i > 0:  # the first add is the one copy of the first payload
                inplace_extra.append(peak - rss)
                inplace_server.append(peak - base)
            agg_peak = max(agg_peak, peak)
        else:  # the last payload both ways: pairwise `total + s` (before) gives the total
            prev = acc.result()
            rss = sampler.reset()
            t0 = time.perf_counter()
            total = prev + s
            out["pairwise_add_seconds"] = time.perf_counter() - t0
            peak = sampler.window_peak()
            out["pairwise_add_extra_bytes"] = peak - rss
            out["pairwise_server_peak_bytes"] = peak - base
            del prev
        del s
    del acc
    assert total is not None
    out["aggregate_wall_seconds"] = time.perf_counter() - t_all
    out["client_seconds_median"] = float(np.median(client_s))
    out["client_seconds_total"] = float(sum(client_s))
    out["inplace_add_seconds_median"] = float(np.median(inplace_s[1:] or inplace_s))
    out["inplace_add_extra_bytes"] = max(inplace_extra, default=0)
    out["inplace_server_peak_bytes"] = max(inplace_server, default=0)
    out["add_seconds_total"] = float(sum(inplace_s) + out["pairwise_add_seconds"])
    out["aggregate_peak_extra_bytes"] = agg_peak - base  # clients and in-place adds
    out["sim_peak_excludes_pairwise"] = True
    out["heads"] = {}
    partial = RESULTS.with_suffix(f".{name}.partial.json")
    partial.write_text(json.dumps(out))
    from ghofl.heads.build import to_jsonable
    from ghofl.heads.registry import head_class
    from ghofl.stats.schema import mode_supports

    for head in heads:
        if not mode_supports(mode, head_class(head).min_mode):
            continue
        rss = sampler.reset()
        res = run_server_job(total, ServerJob((head,), seed=SEED),
                             test=(feats.x_test, feats.y_test))
        score = (res.scores or {})[head]
        out["heads"][head] = {
            "fit_seconds": res.fit_seconds[head],
            "predict_seconds": score.seconds,
            "accuracy": score.accuracy,
            "fit_predict_peak_extra_bytes": sampler.window_peak() - rss,
            "peak_over_baseline_bytes": sampler.window_peak() - base,
            "params": to_jsonable(res.heads[head].get_params()),
            "fitted": {a: to_jsonable(getattr(res.heads[head], a, None))
                       for a in res.heads[head].fitted_scalars},
            "date": out["date"],
        }
        del res
        partial.write_text(json.dumps(out))
        print(f"  {name} {head}: {out['heads'][head]}", file=sys.stderr, flush=True)
    sampler.stop()
    partial.unlink(missing_ok=True)
    return out


def run_config(name: str, heads: tuple[str, ...]) -> dict[str, Any]:
    """Run :func:`worker` for ``name`` in a fresh interpreter and return its JSON."""
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", name, "--heads", ",".join(heads)],
        stdout=subprocess.PIPE, text=True, check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _gb(b: float | None) -> str:
    return "-" if b is None else f"{b / 1e9:.2f}"


def _mb(b: float | None) -> str:
    return "-" if b is None else f"{b / 1e6:.1f}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pair(r: dict[str, Any], before: str, after: str, fmt: Any) -> str:
    """``before / after`` (pairwise ``a + b`` / in-place :class:`StatsTotal`); ``-`` for runs
    measured before the in-place total existed."""
    if after not in r:
        return "-"
    return f"{fmt(r.get(before))} / {fmt(r[after])}"


def _sim_peak(r: dict[str, Any]) -> str:
    """The simulation's peak; a run whose window also held the pairwise measurement gives
    only an upper bound ("≤")."""
    bound = "pairwise_add_seconds" in r and not r.get("sim_peak_excludes_pairwise")
    return ("≤ " if bound else "") + _gb(r["aggregate_peak_extra_bytes"])


def _head_date(run: dict[str, Any], head: dict[str, Any]) -> str:
    """When a head row was measured (its own date, else its configuration's)."""
    return str(head.get("date", run.get("date", "2026-11-30")))


def _qda_cost_note(runs: list[dict[str, Any]]) -> str:
    """How much more QDA would cost at full d than in its smallest measured projection."""
    ks = [r["projection_dim"] for r in runs if r["projection_dim"] and "qda" in r["heads"]]
    if not ks:
        return ""
    k, d = min(ks), runs[0]["dim"]
    return (f" QDA's fit and prediction grow as d³ and C·n·d² (about {(d / k) ** 3:.0f} and "
            f"{(d / k) ** 2:.0f} times its k = {k} row at d = {d}).")


def _machines(data: dict[str, Any]) -> str:
    """The machine line, per group of rows when the rows come from differently set-up runs."""
    rows: dict[str, list[str]] = {}
    for r in data["runs"]:
        run_machine = str(r.get("machine", data["machine"]))
        where = f"`{r['config']}`"
        heads = {h: str(r["heads"][h].get("machine", run_machine))
                 for h in HEADS if h in r["heads"]}
        for m in dict.fromkeys([run_machine, *heads.values()]):
            own = [h for h, hm in heads.items() if hm == m]
            if m == run_machine and len(own) == len(heads):
                rows.setdefault(m, []).append(where)
            elif m == run_machine:
                rows.setdefault(m, []).append(
                    f"{where} (upload and aggregation" + "".join(f", {h}" for h in own) + ")")
            else:
                rows.setdefault(m, []).append(f"{where} ({', '.join(own)})")
    if len(rows) <= 1:
        return f"Machine: {next(iter(rows), data['machine'])}. "
    return "\n".join(["Machines, with the rows measured on each:", "",
                      *(f"* {m}: {', '.join(w)}" for m, w in rows.items()), "", ""])


def _dates(data: dict[str, Any]) -> str:
    """The measurement date, per configuration when the rows come from several runs."""
    dates = {str(r["config"]): str(r.get("date", "2026-11-30")) for r in data["runs"]}
    if len(set(dates.values())) <= 1:
        return next(iter(dates.values()), str(data["date"]))
    return ", ".join(f"{d} (`{c}`)" for c, d in dates.items())


def render(data: dict[str, Any]) -> str:
    from ghofl.bench.report import markdown_table

    runs = data["runs"]
    payload_rows = []
    for r in runs:
        payload_rows.append([
            f"`{r['mode']}`", r["projection_dim"] or "-", _mb(r["upload_bytes_float64"]),
            _mb(r["upload_bytes_float32"]), _mb(r["payload_in_memory_bytes"]),
            f"{r['client_seconds_median']:.2f}",
            _pair(r, "pairwise_add_seconds", "inplace_add_seconds_median", _s),
            _pair(r, "pairwise_add_extra_bytes", "inplace_add_extra_bytes", _gb),
            _pair(r, "pairwise_server_peak_bytes", "inplace_server_peak_bytes", _gb),
            _sim_peak(r), f"{r['load_validate_seconds']:.1f}", _gb(r["load_peak_extra_bytes"]),
        ])
    head_rows = []
    for r in runs:
        for h, v in sorted(r["heads"].items(), key=lambda hv: HEADS.index(hv[0])):
            head_rows.append([
                f"`{r['mode']}`", r["projection_dim"] or "-", h, f"{100 * v['accuracy']:.2f}",
                f"{v['fit_seconds']:.1f}", f"{v['predict_seconds']:.1f}",
                _gb(v["fit_predict_peak_extra_bytes"]), _gb(v["peak_over_baseline_bytes"]),
                _head_date(r, v),
            ])
    r0 = runs[0]
    per_class = r0["n_train"] / r0["classes"]
    skipped = [f"{h} in `{r['mode']}`" + (f" k = {r['projection_dim']}" if r["projection_dim"]
                                         else f" at d = {r['dim']}")
               for r in runs for h in r.get("skipped_heads", [])]
    return "\n".join([
        "## Tiny-ImageNet at C = 200: bytes, server memory and time per head "
        "(`benchmarks/bench_tiny_imagenet.py`)",
        "",
        f"{_machines(data)}Measured {_dates(data)}. EfficientNet-Lite0 at 224 px "
        f"(d = {r0['dim']}), {r0['n_train']:,} training images ({per_class:g} per class) and "
        f"{r0['n_test']:,} test images, {r0['classes']} classes; one federation per row, "
        f"{r0['clients']} clients, α = {r0['alpha']}, seed {r0['seed']}, each configuration "
        "in a fresh process. Memory is the resident set size above the process baseline "
        "(which holds the embeddings), sampled every 5 ms. Timings come from a shared machine "
        "with other jobs running beside the benchmark: read them as upper bounds and as ratios "
        "between rows.",
        "",
        "Upload and aggregation. *Upload*: array bytes one client sends (symmetric matrices "
        "as upper triangles). *In memory*: the same payload held as full matrices. *Client s*: "
        "median seconds for one client's statistics. The server adds the payloads one at a "
        "time as they arrive; each cell *pairwise / in place* compares, in the same run, the "
        "old pairwise sum `total + payload` (a new total allocated per payload; measured on the "
        "last payload) with the in-place running total `StatsTotal.add` (`sum_stats`, the plain "
        "protocol, the store and `ghofl aggregate` use it; median over payloads 2 to 9). *Add "
        "s*: seconds for one payload. *Add extra GB*: memory allocated by that addition. "
        "*Server peak GB*: memory held while adding (running total, arriving payload and the "
        "addition's temporaries). *Sim peak GB*: the whole simulated federation in one process "
        "(clients computing their statistics next to the server's in-place total; the pairwise "
        "measurement excluded; ≤: an upper bound that includes it). *Load s* and *load "
        "peak GB*: one untrusted `load_stats` of a client's file (digest, upper triangles "
        "unpacked, every validity check including the per-class positive semi-definiteness "
        "test: one Cholesky factorisation per class). `-`: not measured in that (older) run.",
        "",
        markdown_table(
            ["mode", "proj k", "upload MB (float64)", "upload MB (float32)", "in memory MB",
             "client s", "add s (pairwise / in place)", "add extra GB (pairwise / in place)",
             "server peak GB (pairwise / in place)", "sim peak GB", "load s", "load peak GB"],
            payload_rows,
        ),
        "",
        "Heads fitted from the total (server side), each at its default hyperparameters. "
        "*Fit peak GB*: memory above the level before that head's fit and prediction; *over "
        "baseline GB*: including the total held in memory. *Measured*: the date of the run "
        "that fitted the head (`--heads` / `--skip` re-run some heads of a configuration and "
        "keep its other rows).",
        "",
        markdown_table(
            ["mode", "proj k", "head", "accuracy %", "fit s", "predict s", "fit peak GB",
             "over baseline GB", "measured"],
            head_rows,
        ),
        *([
            "",
            "Not run (`--skip`): " + ", ".join(skipped) + "." + _qda_cost_note(runs),
        ] if skipped else []),
    ])


def _records(name: str) -> list[dict[str, Any]]:
    path = ROOT / "benchmarks" / "results" / name / "results.json"
    if not path.exists():
        return []
    recs: list[dict[str, Any]] = json.loads(path.read_text())["records"]
    return recs


def _means(recs: list[dict[str, Any]]) -> dict[str, float]:
    import statistics

    fed = [r for r in recs if r["mode"] != "reference"]
    heads = dict.fromkeys(r["head"] for r in fed)
    return {h: statistics.fmean(r["accuracy"] for r in fed if r["head"] == h) for h in heads}


def _spread(recs: list[dict[str, Any]]) -> float:
    """Largest accuracy difference (points) between (α, clients) settings, same head and seed."""
    groups: dict[tuple[Any, ...], list[float]] = {}
    for r in recs:
        if r["mode"] != "reference":
            groups.setdefault((r["head"], r["seed"]), []).append(r["accuracy"])
    return max((100 * (max(v) - min(v)) for v in groups.values()), default=0.0)


def _qda_rule(v: dict[str, Any]) -> str:
    """QDA's shrinkage as a run recorded it (target and coefficient), in words."""
    params, fitted = v.get("params"), v.get("fitted") or {}
    if not params:
        return "hyperparameters not recorded in that run"
    target = QDA_TARGET_WORDS.get(str(params.get("shrinkage_target")),
                                  str(params.get("shrinkage_target")))
    a = fitted.get("shrinkage_")
    values = sorted(set(a)) if isinstance(a, list) else [a]
    coef = "/".join(f"{x:.3g}" for x in values if isinstance(x, int | float)) or "?"
    return f"toward {target}, a = {coef} ({fitted.get('shrinkage_method_', '?')})"


def _logreg_note(ref: dict[str, Any] | None, best: tuple[str, float] | None) -> str:
    """The centralised probe of the main table, from its record."""
    if ref is None:
        return ("* Centralised logistic-regression probe: not in the main table's results "
                "(`benchmarks/results/tiny_imagenet/results.json`); scikit-learn's LDA is the "
                "centralised reference there.")
    det = ref.get("details", {})
    how = (f"C = {det['C']:g} chosen among {len(det['cv_scores'])} values by {det['folds']}-fold "
           f"cross-validation on {det['cv_samples']:,} training rows, then refitted on all "
           f"{ref['n_train']:,}" if det.get("cv_scores") else f"C = {det.get('C', '?')}")
    gap = ("" if best is None else
           f"; the best head of the main table ({best[0]}, {100 * best[1]:.2f} %) is "
           f"{100 * (ref['accuracy'] - best[1]):.2f} points below it")
    return (f"* Centralised logistic-regression probe (main table): "
            f"`ghofl.bench.logreg.LogisticProbe` on standardised embeddings (scikit-learn's "
            f"`LogisticRegression` objective and L-BFGS solver, float32 products), {how}: "
            f"{100 * ref['accuracy']:.2f} % in {ref['fit_seconds'] / 60:.0f} min{gap}.")


def paper_notes(runs: list[dict[str, Any]]) -> str:
    """How the Tiny-ImageNet numbers relate to the paper's setting (values from the results)."""
    main_recs, trained_recs = _records("tiny_imagenet"), _records("tiny_imagenet_trained")
    means, trained = _means(main_recs), _means(trained_recs)
    refs = {r["head"]: r for r in main_recs if r["mode"] == "reference"}
    fed = [r for r in main_recs if r["mode"] != "reference"]
    cells = len({(r["alpha"], r["clients"], r["seed"]) for r in fed})
    modes = ", ".join(f"`{m}`" for m in sorted({r["mode"] for r in fed}))
    lines = ["### Tiny-ImageNet results and the paper", ""]
    if means:
        spread = (f"Largest change of any head between α / client-count settings with the same "
                  f"seed: {_spread(main_recs):.4f} points." if cells > 1 else
                  "The heads are partition invariant (the check runs on `cifar10_main`, see its "
                  "section), so one federation stands for every split.")
        lines.append(
            "Main table (`benchmarks/configs/tiny_imagenet.toml`, section `experiment-"
            "tiny_imagenet`): "
            + (f"{cells} federations in mode {modes}; mean accuracy " if cells > 1
               else f"one federation in mode {modes}; accuracy ")
            + ", ".join(f"{h} {100 * v:.2f} %" for h, v in means.items())
            + "".join(f"; centralised {k} {100 * r['accuracy']:.2f} %"
                      for k, r in sorted(refs.items()))
            + f". {spread}"
        )
    else:
        lines.append("The main table (`tiny_imagenet.toml`) has not been run yet.")
    if trained:
        tcells = len({r["seed"] for r in trained_recs if r["mode"] != "reference"})
        lines.append(
            "Trainable heads at their defaults (`tiny_imagenet_trained.toml`, "
            f"{tcells} seed{'' if tcells == 1 else 's'}): "
            + ", ".join(f"{h} {100 * v:.2f} %" for h, v in trained.items()) + "."
        )
        lda_seed = {r["seed"]: r["accuracy"] for r in fed if r["head"] == "lda"}
        same = [h for h in trained
                if all(abs(r["accuracy"] - lda_seed.get(r["seed"], -1.0)) < 1e-12
                       for r in trained_recs if r["head"] == h and r["mode"] != "reference")]
        if same:
            lines.append(
                f"{' and '.join(same)} score{'' if len(same) > 1 else 's'} exactly LDA's "
                "accuracy in every seed: at C = 200 "
                "their checkpoint selection on held-out synthetic samples kept the initial "
                "(LDA) parameters, so here they add nothing over LDA."
            )
    else:
        lines.append(
            "The trainable heads (`tiny_imagenet_trained.toml`: FisherMix and Proto-Hyper at "
            "their defaults) were not run in this measurement."
        )
    qda = [(r["projection_dim"], r["dim"], r["heads"]["qda"]) for r in runs
           if "qda" in r["heads"]]
    if qda:
        lines.append(
            "QDA (mode `full`, table above; one shrinkage coefficient a for every class "
            "covariance): "
            + "; ".join(
                f"{f'd = {d}' if k is None else f'k = {k}'}: {100 * v['accuracy']:.2f} %, fit "
                f"{v['fit_seconds']:.0f} s, predict {v['predict_seconds']:.0f} s, "
                f"{_qda_rule(v)}"
                for k, d, v in qda
            )
            + "."
        )
    r0 = runs[0] if runs else None
    if r0 is not None:
        per = r0["n_train"] / r0["classes"]
        data = (
            f"Here every class has {per:g} training images (a subset of the official 500, see "
            f"`benchmarks/configs/tiny_imagenet.toml`), so d = {r0['dim']} exceeds every class "
            f"count {r0['dim'] / per:.1f}-fold: each class covariance has rank at most "
            f"{per - 1:g}. QDA rests on shrinkage (by default toward LDA's pooled covariance "
            "rescaled to each class, so what a class's own samples cannot determine comes "
            "from the pooled estimate), as does the class-covariance synthesis of the trainable "
            f"heads in mode `full`, while LDA's pooled covariance "
            f"({r0['n_train'] - r0['classes']:,} degrees of freedom) is well determined. Expect "
            "every head below what 500 per class would give."
        )
    else:
        data = "Expect every head below what 500 training images per class would give."
    by_mode = {r["mode"]: r for r in runs if not r["projection_dim"]}
    exact = ""
    if "full" in by_mode and "pooled" in by_mode:
        common = [h for h in HEADS
                  if h in by_mode["pooled"]["heads"] and h in by_mode["full"]["heads"]]
        equal = [h for h in common if by_mode["pooled"]["heads"][h]["accuracy"]
                 == by_mode["full"]["heads"][h]["accuracy"]]
        differ = [h for h in common if h not in equal]
        who = (f"{', '.join(equal)} score" if len(equal) > 1
               else f"{equal[0]} scores" if equal else "no head scores")
        exact = f"; in the table above {who} the same in both modes" + (
            f", {', '.join(differ)} not (rows measured with different defaults)"
            if differ else "")
    best = max(((h, v) for h, v in means.items()), key=lambda hv: hv[1], default=None)
    lines += [
        "",
        "Where and why these numbers differ from the paper's:",
        "",
        "* No paper number to check against: the paper (and its code, per our reference notes) "
        "reports no Tiny-ImageNet run with EfficientNet-Lite0; its many-class runs (CIFAR-100, "
        "C = 100) use torchvision backbones with 500 training images per class. " + data,
        "* Upload mode: the main table uses `pooled` (one global d x d matrix plus per-class "
        "diagonals) instead of the paper's `full`: at C = 200 and d = 1280 `full` is 200 "
        "second-moment matrices per client (table above). nb, lda and fedcgs get exactly the "
        "same totals in both modes (`pooled` is an exact reduction of `full`)" + exact + "; "
        "FisherMix and Proto-Hyper synthesise from the pooled covariance instead of per-class "
        "ones (`syn_covariance_` records it). QDA needs `full`; the table above shows where it "
        "ran.",
        _logreg_note(refs.get("logreg"), best),
        "* Encoder input: 64x64 images are resized to 224 inside the model (bilinear, no "
        "antialiasing), where the paper's clients use PIL `Resize(224)`.",
        "* Leakage caveat: Tiny-ImageNet was made from ImageNet images and EfficientNet-Lite0 "
        "was pretrained on ImageNet-1k, so the encoder may have seen these images (at full "
        "resolution); absolute accuracies are optimistic, only comparisons between heads on the "
        "same features are meaningful.",
    ]
    return "\n".join(lines)


def merge_heads(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with the head rows of ``old`` (the same configuration's earlier run) that ``new``
    did not measure (not in ``--heads`` or in ``--skip``), each kept with its own date.

    The upload and aggregation columns are always those of ``new`` (every run measures them);
    a kept head row records the date (``"date"``) and the machine line (``"machine"``) of the
    run that measured it."""
    if old is None:
        return new
    old_date = str(old.get("date", "2026-11-30"))
    kept = {h: {**v, "date": v.get("date", old_date)}
            for h, v in old["heads"].items() if h not in new["heads"]}
    for v in kept.values():
        if "machine" not in v and "machine" in old:
            v["machine"] = old["machine"]
    return {**new, "heads": {**kept, **new["heads"]}}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only, alias --render,
    --no-write and --out)."""
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--heads", default=",".join(HEADS))
    ap.add_argument("--skip", default="", help="CONFIG:HEAD pairs not to run, e.g. full:qda "
                    "(their rows from an earlier run are kept)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def measure(ctx: harness.Context) -> dict[str, Any] | None:
    """Each configuration in a fresh process, the results saved after each; with
    ``--worker NAME``, this process is that fresh one: it prints its JSON and writes nothing."""
    args = ctx.args
    heads = tuple(h for h in args.heads.split(",") if h)
    if args.worker:
        print(json.dumps(worker(args.worker, heads)))
        return None
    from ghofl.bench.report import machine_summary

    names = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"unknown config(s) {unknown}; choose among {list(CONFIGS)}")
    old_data = ctx.load(RESULTS.name, {"runs": []})
    runs = {r["config"]: r for r in old_data["runs"]}
    for r in runs.values():  # runs from before the per-run machine line
        if "machine" in old_data:
            r.setdefault("machine", old_data["machine"])
    skip = {tuple(p.split(":", 1)) for p in args.skip.split(",") if ":" in p}
    data = None
    for name in names:  # the JSON is rewritten after each, so a partial run keeps its rows
        print(f"[{name}]", file=sys.stderr, flush=True)
        new = run_config(name, tuple(h for h in heads if (name, h) not in skip))
        runs[name] = merge_heads(runs.get(name), new)
        not_run = {h for c, h in skip if c == name} - set(runs[name]["heads"])
        if not_run:
            runs[name]["skipped_heads"] = sorted(not_run)
        data = {
            "machine": machine_summary(),
            "date": time.strftime("%Y-%m-%d"),
            "runs": [runs[c] for c in CONFIGS if c in runs],
        }
        ctx.save(RESULTS.name, data)
    return None if data is None else {SECTION: data}


def render_section(data: dict[str, Any]) -> str:
    """The section: the tables of :func:`render` and the notes of :func:`paper_notes`."""
    return render(data) + "\n\n" + paper_notes(data["runs"])


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, RESULTS.name, render_section),),
    measure=measure,
    timings=True,
    add_arguments=add_arguments,
    report_aliases=("--render",),
    child_processes=True,
)

if __name__ == "__main__":
    harness.main(BENCH)
