"""Differential privacy on CIFAR-10 features: accuracy vs ε, and the noise's empirical std.

EfficientNet-Lite0 (224 px) embeddings of a CIFAR-10 subset (300 train / 100 test images per
class, cached), 10 clients (Dirichlet α = 0.5), statistics in a public random projection to
k = PROJECTION_DIM dimensions (full-dimensional d = 1280 second moments take minutes per run to
aggregate and post-process, and need ~d/k times more noise energy), clipped at the encoder's
default R. For ε ∈ {∞, 8, 4, 2, 1, 0.5} at δ = 1e-5, central (plain sum, noise on the total)
and distributed (secure aggregation, each client adds a share; threshold t = 6), 3 seeds, every
head (the trainable heads with EPOCHS epochs to fit the time budget). The minimum-count rule is
off (k = 1) so the figure shows the cost of the mechanism alone (k = 5 multiplies every σ by 5).

Then an empirical check: many seeded draws of the central noise and of the sum of t distributed
shares, whose sample standard deviation must lie in the two-sided 99.9 % chi-square interval
around the calibrated σ.

Writes benchmarks/results/dp.json and the ``dp`` section of BENCHMARKS.md.
Run: ``.venv/bin/python benchmarks/bench_dp.py`` (needs the ``privacy`` extra and
``GHOFL_DATA_DIR`` or ../shared/data); ``--report-only`` (or ``--render-only``) rewrites the
section from the saved results.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import numpy as np
from scipy.stats import chi2

from ghofl.bench import harness
from ghofl.bench.config import config_from_dict
from ghofl.bench.features import load_features
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.encoders import default_clip_norm
from ghofl.client.job import ClientJob
from ghofl.privacy import NOISE_CLAMP_SIGMAS, DPConfig, draw_noise, plan_noise
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server_job import ServerJob
from ghofl.simulation import Population, simulate

EPSILONS: tuple[float, ...] = (math.inf, 8.0, 4.0, 2.0, 1.0, 0.5)
DELTA = 1e-5
SEEDS = (0, 1, 2)
HEADS = ("nb", "lda", "qda", "fedcgs", "fishermix", "protohyper")
EPOCHS = 5
CLIENTS = 10
THRESHOLD = 6
PROJECTION_DIM = 64
NOISE_DRAWS = 20_000


def _head_params() -> dict[str, dict[str, Any]]:
    return {h: {"epochs": EPOCHS} for h in ("fishermix", "protohyper")}


def accuracy_grid(feats: Any, clip: float) -> list[dict[str, Any]]:
    rows = []
    for dp_mode in ("central", "distributed"):
        for eps in EPSILONS:
            accs: dict[str, list[float]] = {h: [] for h in HEADS}
            t0 = time.perf_counter()
            privacy = None
            for seed in SEEDS:
                dp = None if math.isinf(eps) else DPConfig(eps, DELTA, dp_mode)  # type: ignore[arg-type]
                agg = (AggregationSpec("secure", threshold=THRESHOLD, dp=dp)
                       if dp_mode == "distributed" else AggregationSpec("plain", dp=dp))
                plan = FederationPlan(
                    ClientJob(tuple(feats.classes), "full", projection_dim=PROJECTION_DIM,
                              projection_seed=0, clip_norm=clip), agg,
                    ServerJob(HEADS, _head_params(), seed=seed))
                res = simulate(plan, (feats.x_train, feats.y_train),
                               (feats.x_test, feats.y_test), Population(CLIENTS, 0.5))
                for h in HEADS:
                    accs[h].append(res.heads[h].accuracy)
                privacy = res.privacy
            row = {"dp_mode": dp_mode, "epsilon": None if math.isinf(eps) else eps,
                   "seconds": time.perf_counter() - t0,
                   "accuracy": {h: accs[h] for h in HEADS},
                   "sigma": None if privacy is None else privacy["sigma"],
                   "noise_multiplier": None if privacy is None else privacy["noise_multiplier"],
                   "delta_spent": None if privacy is None else privacy["delta_spent"]}
            print(dp_mode, eps, {h: round(statistics.fmean(a), 4) for h, a in accs.items()},
                  f"{row['seconds']:.0f}s", flush=True)
            rows.append(row)
    return rows


def noise_check(clip: float) -> list[dict[str, Any]]:
    """Sample std of seeded noise vs the calibrated σ, per block, with a chi-square interval."""
    out = []
    c, d = 10, 8
    for dp_mode in ("central", "distributed"):
        plan = plan_noise(DPConfig(1.0, DELTA, dp_mode), "pooled", clip)  # type: ignore[arg-type]
        rng = np.random.default_rng(1234)
        draws: dict[str, list[float]] = {}
        for _ in range(NOISE_DRAWS // c):
            if dp_mode == "central":
                counts, floats = draw_noise(plan, c, d, rng)
            else:  # the sum of t clamped shares of variance σ²/t
                parts = [draw_noise(plan, c, d, rng, scale=1 / math.sqrt(THRESHOLD),
                                    clamp=NOISE_CLAMP_SIGMAS) for _ in range(THRESHOLD)]
                counts = sum(p[0] for p in parts)  # type: ignore[assignment]
                floats = sum(p[1] for p in parts)  # type: ignore[assignment]
            draws.setdefault("counts", []).extend(counts.tolist())
            from ghofl.stats.schema import schema_for
            for seg in schema_for("pooled").float_layout(c, d):
                draws.setdefault(seg.name, []).extend(floats[seg.offset:seg.stop][:c].tolist())
        for block, values in draws.items():
            n = len(values)
            sd = float(np.std(values))
            lo, hi = (math.sqrt(chi2.ppf(q, n) / n) for q in (0.0005, 0.9995))
            sigma = plan.sigma[block]
            out.append({"dp_mode": dp_mode, "block": block, "n": n, "sigma": sigma,
                        "empirical": sd, "ratio": sd / sigma, "ratio_interval": [lo, hi],
                        "ok": lo <= sd / sigma <= hi})
    return out


def render(result: dict[str, Any]) -> str:
    grid = result["grid"]
    header = ["mode", "ε", *HEADS]
    rows = []
    for r in grid:
        eps = "∞" if r["epsilon"] is None else f"{r['epsilon']:g}"
        rows.append([r["dp_mode"], eps] + [
            f"{100 * statistics.fmean(r['accuracy'][h]):.1f} ± "
            f"{100 * statistics.stdev(r['accuracy'][h]):.1f}" for h in HEADS])
    check = [[c["dp_mode"], c["block"], c["n"], f"{c['sigma']:.4g}", f"{c['empirical']:.4g}",
              f"{c['ratio']:.4f}", f"[{c['ratio_interval'][0]:.4f}, {c['ratio_interval'][1]:.4f}]",
              "yes" if c["ok"] else "NO"] for c in result["noise_check"]]
    cfg = result["config"]
    return "\n".join([
        "## Differential privacy: accuracy vs ε (`benchmarks/bench_dp.py`)",
        "",
        f"CIFAR-10, EfficientNet-Lite0 @224 features ({cfg['train_per_class']} train / "
        f"{cfg['test_per_class']} test images per class), {CLIENTS} clients (Dirichlet α=0.5), "
        f"full mode in a public projection to k={PROJECTION_DIM}, clip R={cfg['clip']:g}, "
        f"δ={DELTA:g}, add/remove-one-sample DP of the single release, equal budget split over "
        f"the blocks (counts, sums, class scatter), minimum-count rule off (k=1). Central: plain "
        f"sum, the server noises the total. Distributed: secure aggregation (t={THRESHOLD}), "
        f"each client adds a share of variance σ²/t. Accuracy (%) mean ± std over seeds "
        f"{list(SEEDS)} (partition, noise, trainable heads; FisherMix and Proto-Hyper with "
        f"{EPOCHS} epochs). Generated by `benchmarks/bench_dp.py` "
        f"({result['seconds']:.0f} s, {result['machine']}).",
        "",
        markdown_table(header, rows),
        "",
        f"Empirical check of the noise ({NOISE_DRAWS} draws per block, seeded, ε=1, pooled "
        f"mode, R={cfg['clip']:g}; distributed: sum of t={THRESHOLD} clamped shares). "
        "`interval`: two-sided 99.9 % chi-square interval of std/σ.",
        "",
        markdown_table(["mode", "block", "draws", "σ", "empirical std", "std/σ", "interval",
                        "within"], check),
    ])


def measure(ctx: harness.Context) -> dict[str, Any]:
    """The noise check, then the accuracy grid (central, then distributed; ε; seeds)."""
    t0 = time.perf_counter()
    data_dir = ctx.data_dir()
    cfg = config_from_dict({"datasets": ["cifar10"], "train_per_class": 300,
                            "test_per_class": 100, "data_dir": data_dir})
    feats = load_features("cifar10", "efficientnet-lite0", cfg)
    clip = default_clip_norm(feats.encoder_info)
    assert clip is not None
    result: dict[str, Any] = {
        "config": {"train_per_class": 300, "test_per_class": 100, "clients": CLIENTS,
                   "threshold": THRESHOLD, "projection_dim": PROJECTION_DIM, "clip": clip,
                   "delta": DELTA, "seeds": list(SEEDS), "heads": list(HEADS),
                   "trainable_epochs": EPOCHS},
        "noise_check": noise_check(clip),
        "grid": accuracy_grid(feats, clip),
    }
    result["seconds"] = time.perf_counter() - t0
    result["machine"] = machine_summary()
    return {"dp": result}


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("dp", "dp.json", render),),
    measure=measure,
    report_aliases=("--render-only",),
)

if __name__ == "__main__":
    harness.main(BENCH)
