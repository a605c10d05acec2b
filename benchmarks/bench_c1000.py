"""C = 1,000 classes: every head of the upload mode, against time and memory targets (issue 23).

Synthetic class-conditional Gaussian data with a power-law spectrum
(:mod:`ghofl.bench.spectrum`: eigenvalues ∝ i^-1 summing to 100, per-class covariances as
per-direction perturbations of the shared one, class means spread along the same spectrum),
N_c = 50 training samples per class (50,000 in all) accumulated into the client statistics in
chunks of 100 classes, and 10 test samples per class (10,000). Two configurations:

* ``pooled``, d = 1280 (per-class diagonals and one global B), every head but QDA;
* ``full``, d = 512 (per-class second moments S_c: C·d²·8 = 2.1 GB), every head.

Each head runs in a fresh process (its own memory peak) that draws the statistics, runs the
pre-flight estimate (:func:`ghofl.heads.preflight.preflight`, the one ``ghofl fit`` runs),
fits, then draws the test set and predicts. Reported per head: fit seconds, predict seconds
(10,000 samples), the peak resident set size of the process during the fit (sampled every
5 ms; it includes the interpreter and the statistics total the server holds), the test
accuracy, and the verdict against the targets: fit ≤ 2 minutes (closed-form heads) or ≤ 5
minutes (trainable heads), peak ≤ 8 GB. A head still running at its target plus
``--grace`` seconds is stopped and reported as "exceeded after X s".

The trainable heads (fishermix, protohyper) train ``--epochs`` epochs (default 2, instead of
their default 40, so the whole run fits in about 25 minutes on 2 cores); their row also gives
the fit extrapolated to 40 epochs (the other stages plus 40 times the measured seconds per
epoch; an upper bound, as early stopping may end sooner), and the verdict uses it.

Run: ``flock scratch/cpu.lock .venv/bin/python benchmarks/bench_c1000.py`` (about 25 minutes on
2 cores). ``--configs full`` and ``--heads qda,lda`` re-run some rows (the others are kept
from the JSON); ``--report-only`` rewrites the section from the JSON. Writes
``benchmarks/results/c1000.json`` and the section ``c1000`` of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from ghofl.bench import harness

ROOT = Path(__file__).resolve().parents[1]
SECTION = "c1000"
RESULTS = ROOT / "benchmarks" / "results" / "c1000.json"
HEADS = ("nb", "ncm", "lda", "fedcgs", "ridge", "fed3r", "fedcof", "qda", "fishermix",
         "protohyper")
TRAINABLE = ("fishermix", "protohyper")
#: name -> (mode, d, separation of the class means)
CONFIGS: dict[str, tuple[str, int, float]] = {"pooled": ("pooled", 1280, 0.15),
                                              "full": ("full", 512, 0.22)}
CLASSES, PER_CLASS, TEST_PER_CLASS, SEED = 1000, 50, 10, 0
#: targets of issue 23
FIT_TARGET_S = {"closed": 120.0, "trainable": 300.0}
MEMORY_TARGET = 8e9
DEFAULT_EPOCHS = 40


def kind(head: str) -> str:
    """``"trainable"`` or ``"closed"`` (closed-form)."""
    return "trainable" if head in TRAINABLE else "closed"


def _write(path: Path, out: dict[str, Any]) -> None:
    path.write_text(json.dumps(out))


def worker(config: str, head: str, epochs: int, progress: Path) -> dict[str, Any]:
    """Measure one head of one configuration in this (fresh) process.

    What is measured so far is written to ``progress`` after every stage, so a head stopped
    at its time limit keeps the stages it finished."""
    import numpy as np

    from bench_tiny_imagenet import RssSampler
    from ghofl.bench.spectrum import class_statistics, draw, spectrum_classes
    from ghofl.heads.build import build_heads
    from ghofl.heads.preflight import preflight
    from ghofl.stats.codec import payload_nbytes

    mode, d, sep = CONFIGS[config]
    sampler = RssSampler()
    out: dict[str, Any] = {"head": head, "kind": kind(head), "baseline_rss_bytes": sampler.now(),
                           "load_average": os.getloadavg()}
    t0 = time.perf_counter()
    gen = spectrum_classes(SEED, d, CLASSES, separation=sep)
    total = class_statistics(gen, PER_CLASS, mode, seed=SEED + 1)  # type: ignore[arg-type]
    out["client_seconds"] = time.perf_counter() - t0
    out["upload_bytes_float64"] = payload_nbytes(total)
    params = {h: {"epochs": epochs} for h in TRAINABLE}
    models = build_heads((head,), params, seed=SEED, mode=total.mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = preflight(models, total.mode, total.num_classes, total.dim,
                        min_count=int(total.counts.min()))[head]
    out["preflight"] = {"memory_bytes": est.memory_bytes, "flops": est.flops,
                        "warnings": [str(w.message) for w in caught]}
    out["stats_rss_bytes"] = sampler.reset()
    _write(progress, out)
    model = models[head]
    t0 = time.perf_counter()
    model.fit_from_stats(total)
    out["fit_seconds"] = time.perf_counter() - t0
    out["fit_peak_rss_bytes"] = sampler.window_peak()
    if head in TRAINABLE:
        out["stages"] = dict(model.fit_seconds_)  # type: ignore[attr-defined]
        out["epochs"] = epochs
        out["epochs_run"] = int(model.epochs_run_)  # type: ignore[attr-defined]
        out["selected_epoch"] = model.selected_epoch_  # type: ignore[attr-defined]
    _write(progress, out)
    y = np.repeat(np.arange(CLASSES, dtype=np.int64), TEST_PER_CLASS)
    x = draw(gen, y, np.random.default_rng(SEED + 2))
    sampler.reset()
    t0 = time.perf_counter()
    pred = model.predict(x)
    out["predict_seconds"] = time.perf_counter() - t0
    out["predict_peak_rss_bytes"] = sampler.window_peak()
    out["accuracy"] = float(np.mean(pred == y))
    sampler.stop()
    _write(progress, out)
    return out


def run_head(config: str, head: str, epochs: int, grace: float) -> dict[str, Any]:
    """:func:`worker` in a fresh interpreter, stopped at the head's fit target + ``grace``
    seconds of wall time (drawing the statistics and the test set included)."""
    limit = FIT_TARGET_S[kind(head)] + grace
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress.json"
        cmd = [sys.executable, __file__, "--worker", f"{config}:{head}", "--epochs", str(epochs),
               "--progress", str(progress)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        try:
            proc.wait(timeout=limit)
            killed = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed = True
        wall = time.perf_counter() - t0
        out: dict[str, Any] = json.loads(progress.read_text()) if progress.exists() else {}
    if killed or proc.returncode != 0:
        out["stopped"] = {"after_seconds": wall, "limit_seconds": limit,
                          "returncode": proc.returncode, "killed": killed}
    out.update(head=head, kind=kind(head), date=time.strftime("%Y-%m-%d"))
    return out


def extrapolated_fit(r: dict[str, Any]) -> float | None:
    """A trainable head's fit if all 40 default epochs ran: other stages + 40 × seconds per
    epoch (an upper bound: early stopping may end sooner)."""
    if "stages" not in r or not r.get("epochs_run"):
        return r.get("fit_seconds")
    st = r["stages"]
    per_epoch = st["training"] / r["epochs_run"]
    return float(sum(v for k, v in st.items() if k != "training") + DEFAULT_EPOCHS * per_epoch)


def verdict(r: dict[str, Any]) -> str:
    """``met`` / ``exceeded (...)`` against the fit-time and memory targets."""
    target = FIT_TARGET_S[r["kind"]]
    if "fit_seconds" not in r:
        stop = r.get("stopped", {})
        return f"exceeded: fit not done after {stop.get('after_seconds', 0):.0f} s"
    bad = []
    fit = r["fit_seconds"] if _default_epochs(r) else (extrapolated_fit(r) or r["fit_seconds"])
    if fit > target:
        bad.append(f"fit {fit:.0f} s > {target:.0f} s")
    if r["fit_peak_rss_bytes"] > MEMORY_TARGET:
        bad.append(f"peak {r['fit_peak_rss_bytes'] / 1e9:.1f} GB > 8 GB")
    return "met" if not bad else "exceeded: " + "; ".join(bad)


def _default_epochs(r: dict[str, Any]) -> bool:
    """Whether a trainable head ran with its default epochs (then its fit is the real one,
    early stopping included); runs before this field existed used 2."""
    return r["kind"] == "trainable" and int(r.get("epochs", 2)) >= DEFAULT_EPOCHS


def _cell(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _preflight_cell(run: dict[str, Any], r: dict[str, Any]) -> str:
    """The pre-flight memory estimate of the head (computed now, with the current estimator)
    and whether the measured run warned."""
    from ghofl.heads.build import build_heads
    from ghofl.heads.preflight import estimate_fit

    params = {h: {"epochs": 2} for h in TRAINABLE}
    head = build_heads((r["head"],), params, seed=SEED)[r["head"]]
    est = estimate_fit(head, run["mode"], CLASSES, run["dim"], min_count=PER_CLASS).memory_bytes
    warned = r.get("preflight", {}).get("warnings", [])
    words = [w for w in ("memory", "time") if any(f"estimated {w}" in m for m in warned)]
    return f"{est / 1e9:.1f} GB" + (" (warned: " + ", ".join(words) + ")" if words else "")


def head_row(run: dict[str, Any], r: dict[str, Any]) -> list[Any]:
    """One table row of head ``r`` in configuration ``run``."""
    fit = _cell(r.get("fit_seconds"))
    if r["head"] in TRAINABLE and r.get("epochs_run"):
        bound = "≤" if _default_epochs(r) else "≈"
        fit += (f" ({r['epochs_run']} of {r.get('epochs', 2)} ep.; 40 ep. {bound} "
                f"{extrapolated_fit(r):.0f})")
    acc = r.get("accuracy")
    return [f"`{run['mode']}`", run["dim"], r["head"], fit, _cell(r.get("predict_seconds")),
            _cell(r.get("fit_peak_rss_bytes") and r["fit_peak_rss_bytes"] / 1e9, "{:.2f}"),
            "-" if acc is None else f"{100 * acc:.2f}", _preflight_cell(run, r), verdict(r)]


def render(data: dict[str, Any]) -> str:
    """The section: the table, the client side and the notes."""
    from ghofl.bench.report import markdown_table

    rows, client = [], []
    for run in data["runs"]:
        heads = [run["heads"][h] for h in HEADS if h in run["heads"]]
        rows += [head_row(run, r) for r in heads]
        secs = [r["client_seconds"] for r in heads if "client_seconds" in r]
        up = next((r["upload_bytes_float64"] for r in heads if "upload_bytes_float64" in r), 0)
        client.append(f"`{run['mode']}` d = {run['dim']}: {up / 1e9:.2f} GB of statistics "
                      f"(float64), drawn and accumulated in {min(secs):.0f} s")
    table = markdown_table(
        ["mode", "d", "head", "fit s", "predict s", "peak RSS GB", "accuracy %",
         "pre-flight estimate", "verdict"], rows)
    trained = [r for run in data["runs"] for r in run["heads"].values()
               if r["kind"] == "trainable" and "fit_seconds" in r]
    epoch_notes = [_epochs_note(e) for e in sorted({int(r.get("epochs", 2)) for r in trained})]
    for run in data["runs"]:
        loads = [r["load_average"][0] for r in run["heads"].values() if "load_average" in r]
        if loads:
            epoch_notes.append(
                f"* `{run['mode']}` d = {run['dim']}: load average (1 min) at the start of "
                f"the {len(loads)} head(s) measured last: {min(loads):.1f}–{max(loads):.1f} on "
                "2 cores (other jobs ran concurrently: times, and the time limits, which "
                "include drawing the statistics, are worse than on a quiet machine).")
    return "\n".join([
        f"C = {CLASSES:,} classes, N_c = {PER_CLASS} training samples per class "
        f"({CLASSES * PER_CLASS:,}), {CLASSES * TEST_PER_CLASS:,} test samples; synthetic "
        "Gaussian classes with eigenvalues ∝ i^-1 (trace 100) and per-class perturbed "
        "covariances (`ghofl.bench.spectrum`). Targets (issue 23): fit ≤ 2 min per "
        "closed-form head, ≤ 5 min per trainable head, peak server memory ≤ 8 GB. "
        f"Machine: {data['machine']}. Measured {data['date']} with "
        "`benchmarks/bench_c1000.py`.", "", table, "",
        "* Peak RSS: the whole fitting process (interpreter, torch, the statistics total and "
        "the fit), each head in a fresh process. Predict: 10,000 samples.",
        *epoch_notes,
        "* Pre-flight estimate: the working memory `ghofl fit` now estimates before fitting "
        "(`ghofl.heads.preflight`, beyond the statistics total); it warns when that is beyond "
        "the available memory or the estimated time beyond 10 minutes (\"warned\": it did in "
        "the measured run).",
        "* Client side: " + "; ".join(client) + ".",
        "* A head still running at its target + grace is stopped: \"fit not done after X s\".",
        "* ridge, fed3r and fedcof: the temperature calibration scores synthetic rows against "
        "all C classes: `n_calibration` (256) per class up to 65,536 rows in all, fewer per "
        "class above C = 256 (65 at C = 1,000), its objective summed in row blocks; with 256 "
        "per class at any C its time and memory grew as C² (the cap bounds them by C; the "
        "pre-flight estimate counts it; a temperature never moves a prediction).",
        *_missing(data),
    ])


def _epochs_note(epochs: int) -> str:
    """The note on the trainable heads' epochs (``--epochs`` of the last run)."""
    if epochs >= DEFAULT_EPOCHS:
        return ("* Trainable heads: their default 40 epochs with model selection and early "
                "stopping (patience 5) on held-out synthetic samples; \"N of 40 ep.\" are the "
                "epochs run, the fit column also gives the bound if all 40 ran (other stages + "
                "40 × seconds per epoch). The verdict uses the measured fit. Synthetic rows, "
                "targets and products in float32 (`train_dtype=\"auto\"`, C·k_f > 10⁵).")
    return (f"* Trainable heads: {epochs} epochs instead of {DEFAULT_EPOCHS} (`--epochs`, to "
            "keep the run near 25 minutes); the fit column adds the extrapolation to 40 epochs "
            "(other stages + 40 × seconds per epoch, an upper bound: early stopping may end "
            "sooner), which the verdict uses; their accuracy is the one after the epochs run.")


def _missing(data: dict[str, Any]) -> list[str]:
    """A note listing the heads of each configuration not measured yet."""
    from ghofl.heads.registry import head_class
    from ghofl.stats.schema import mode_supports

    todo = []
    for name, (mode, d, _) in CONFIGS.items():
        run: dict[str, Any] = next((r for r in data["runs"] if r["config"] == name),
                                   {"heads": {}})
        ok = [h for h in HEADS
              if mode_supports(mode, head_class(h).min_mode)]  # type: ignore[arg-type]
        left = [h for h in ok if h not in run["heads"]]
        if left:
            todo.append(f"`{mode}` d = {d}: " + ", ".join(left))
    return ["* Not measured yet (the run was stopped at the session's time limit): "
            + "; ".join(todo) + "."] if todo else []


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's common ones)."""
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--heads", default=",".join(HEADS))
    ap.add_argument("--epochs", type=int, default=2, help="epochs of the trainable heads")
    ap.add_argument("--grace", type=float, default=60.0,
                    help="seconds past its fit target before a head's process is stopped")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--progress", default=None, help=argparse.SUPPRESS)


def measure(ctx: harness.Context) -> dict[str, Any] | None:
    """Every head of every configuration in its own process; the JSON is saved after each."""
    from ghofl.bench.report import machine_summary
    from ghofl.heads.registry import head_class
    from ghofl.stats.schema import mode_supports

    args = ctx.args
    if args.worker:
        config, head = args.worker.split(":")
        worker(config, head, args.epochs, Path(args.progress))
        return None
    old = ctx.load(RESULTS.name, {"runs": []})
    runs = {r["config"]: r for r in old["runs"]}
    data = None
    for name in [c for c in args.configs.split(",") if c]:
        mode, d, sep = CONFIGS[name]
        run = runs.setdefault(name, {"config": name, "mode": mode, "dim": d, "heads": {}})
        run["separation"] = sep
        for head in [h for h in args.heads.split(",") if h]:
            if not mode_supports(mode, head_class(head).min_mode):  # type: ignore[arg-type]
                continue
            ctx.log(f"[{name}] {head}...")
            run["heads"][head] = run_head(name, head, args.epochs, args.grace)
            ctx.log(f"  {verdict(run['heads'][head])}: {run['heads'][head]}")
            data = {"machine": machine_summary(), "date": time.strftime("%Y-%m-%d"),
                    "trainable_epochs": args.epochs,
                    "runs": [runs[c] for c in CONFIGS if c in runs]}
            ctx.save(RESULTS.name, data)
    return None if data is None else {SECTION: data}


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, RESULTS.name, render),),
    measure=measure,
    timings=True,
    add_arguments=add_arguments,
    child_processes=True,
)

if __name__ == "__main__":
    harness.main(BENCH)
