"""Differential privacy on CIFAR-10 features: accuracy vs ε, and the noise's empirical std.

EfficientNet-Lite0 (224 px) embeddings of a CIFAR-10 subset (300 train / 100 test images per
class, cached), 10 clients (Dirichlet α = 0.5), statistics in a public random projection to
k = PROJECTION_DIM dimensions (full-dimensional d = 1280 second moments take minutes per run to
aggregate and post-process, and need ~d/k times more noise energy), clipped at the encoder's
bound for DP (:func:`ghofl.client.encoders.recommended_clip_norm` with ``dp=True``: the median
public norm, what ``ghofl simulate`` takes under DP), the ε = ∞ rows at the same R. For
ε ∈ {∞, 8, 4, 2, 1, 0.5} at δ = 1e-5, central (plain sum, noise on the total) and distributed
(secure aggregation, each client adds a base share and removable dropout levels, the server
removes the levels released at the survivor count; threshold t = 6), 10 seeds (mean ± standard
error, the rule of every DP section; each (seed, ε) its own simulation seed,
:func:`simulation_seed`), every head (the trainable heads with EPOCHS epochs to
fit the time budget). Then the same
at 100 clients (default threshold t = 67, a 16-level geometric ladder) for ε ∈ SCALE_EPSILONS.
The minimum-count rule is off (k = 1) so the figure shows the cost of the mechanism alone (k = 5
multiplies every σ by 5).

Then an empirical check: many seeded draws of the central noise and of the distributed noise
kept in a sum over s survivors (s base shares plus the levels not released at s, expanded from
fresh seeds exactly as the protocol does), whose sample standard deviation must lie in the
two-sided 99.9 % chi-square interval around the calibrated σ.

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
from ghofl.bench.decide import fmt_mean_se, within
from ghofl.bench.features import load_features
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.encoders import recommended_clip_norm
from ghofl.client.job import ClientJob
from ghofl.privacy import NOISE_CLAMP_SIGMAS, DPConfig, draw_noise, entry_scales, plan_noise
from ghofl.privacy.distributed import level_variances, level_words
from ghofl.secure import SecAggConfig
from ghofl.secure.levels import MAX_NOISE_LEVELS, released_levels
from ghofl.secure.primitives import random_seed
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server.simulation import Population, simulate
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import schema_for

EPSILONS: tuple[float, ...] = (math.inf, 8.0, 4.0, 2.0, 1.0, 0.5)
DELTA = 1e-5
SEEDS = tuple(range(10))
HEADS = ("nb", "lda", "qda", "fedcgs", "fishermix", "protohyper")
EPOCHS = 5
CLIENTS = 10
THRESHOLD = 6
PROJECTION_DIM = 64
NOISE_DRAWS = 20_000
SCALE_CLIENTS = 100
SCALE_EPSILONS: tuple[float, ...] = (4.0, 2.0, 1.0)
#: survivor counts of the noise check (n = CLIENTS down to t = THRESHOLD)
CHECK_SURVIVORS = (10, 8, 6)
#: heads whose distributed-vs-central gap the target is read on (nb and qda: std over seeds of
#: 2-12 points at these ε, so a gap of their means says little)
GAP_HEADS = ("lda", "fedcgs", "fishermix", "protohyper")


def simulation_seed(seed: int, eps: float) -> int:
    """The simulation's seed (partition, noise, trainable heads) of ``seed`` at ``eps``.

    ``seed`` itself at ε = ∞; under DP a function of (seed, ε), so that every (seed, ε) draws
    independent noise: with one seed per run the noise direction would be the same at every
    ε (only its scale changes), and the ε rows would not be independent evidence.
    """
    if math.isinf(eps):
        return seed
    return int(np.random.SeedSequence([seed, round(1000 * eps)]).generate_state(1)[0])


def _head_params() -> dict[str, dict[str, Any]]:
    return {h: {"epochs": EPOCHS} for h in ("fishermix", "protohyper")}


def accuracy_grid(feats: Any, clip: float, clients: int = CLIENTS,
                  epsilons: tuple[float, ...] = EPSILONS,
                  threshold: int | None = THRESHOLD) -> list[dict[str, Any]]:
    rows = []
    for dp_mode in ("central", "distributed"):
        for eps in epsilons:
            accs: dict[str, list[float]] = {h: [] for h in HEADS}
            t0 = time.perf_counter()
            privacy = None
            for seed in SEEDS:
                dp = None if math.isinf(eps) else DPConfig(eps, DELTA, dp_mode)  # type: ignore[arg-type]
                agg = (AggregationSpec("secure", threshold=threshold, dp=dp)
                       if dp_mode == "distributed" else AggregationSpec("plain", dp=dp))
                plan = FederationPlan(
                    ClientJob(tuple(feats.classes), "full", projection_dim=PROJECTION_DIM,
                              projection_seed=0, clip_norm=clip), agg,
                    ServerJob(HEADS, _head_params(), seed=simulation_seed(seed, eps)))
                res = simulate(plan, (feats.x_train, feats.y_train),
                               (feats.x_test, feats.y_test), Population(clients, 0.5))
                for h in HEADS:
                    accs[h].append(res.heads[h].accuracy)
                privacy = res.privacy
            row = {"dp_mode": dp_mode, "clients": clients,
                   "epsilon": None if math.isinf(eps) else eps,
                   "seconds": time.perf_counter() - t0,
                   "accuracy": {h: accs[h] for h in HEADS}, "se": True,
                   "sigma": None if privacy is None else privacy["sigma"],
                   "noise_multiplier": None if privacy is None else privacy["noise_multiplier"],
                   "delta_spent": None if privacy is None else privacy["delta_spent"],
                   "epsilon_spent": None if privacy is None else privacy["epsilon_spent"],
                   "kept_variance": None if privacy is None else
                   privacy.get("distributed_noise", {}).get("kept_variance")}
            print(clients, dp_mode, eps,
                  {h: round(statistics.fmean(a), 4) for h, a in accs.items()},
                  f"{row['seconds']:.0f}s", flush=True)
            rows.append(row)
    return rows


def _kept_distributed(plan: Any, meta: StatsMeta, params: Any, survivors: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The distributed noise left in a sum over ``survivors`` clients after the removal."""
    c, d = meta.num_classes, meta.dim
    base = math.sqrt(level_variances(params)[0])
    kept = [j for j in range(len(params.release_points))
            if j not in released_levels(params.release_points, survivors)]
    words = np.zeros(params.codec.length(meta), np.uint64)
    counts, floats = np.zeros(c), np.zeros(schema_for(meta.mode).float_layout(c, d)[-1].stop)
    for _ in range(survivors):
        dc, df = draw_noise(plan, c, d, rng, scale=base, clamp=NOISE_CLAMP_SIGMAS)
        counts, floats = counts + dc, floats + df
        for j in kept:  # expanded from a fresh seed, as a client does
            words += level_words(plan, params, meta, j, random_seed())
    ints, extra = params.codec.decode_vectors(meta, words)
    return counts + np.ldexp(ints[:c].astype(np.float64), -16), floats + extra


def noise_check(clip: float) -> list[dict[str, Any]]:
    """Sample std of seeded noise vs the calibrated σ, per block, with a chi-square interval."""
    out = []
    c, d = 10, 8
    meta = StatsMeta("pooled", d, tuple(str(i) for i in range(c)), clip_norm=clip)
    params = SecAggConfig(clip_norm=clip, threshold=THRESHOLD,
                          noise_levels=MAX_NOISE_LEVELS).for_clients(CLIENTS)
    for dp_mode, s in [("central", None)] + [("distributed", s) for s in CHECK_SURVIVORS]:
        plan = plan_noise(DPConfig(1.0, DELTA, dp_mode), "pooled", clip)  # type: ignore[arg-type]
        rng = np.random.default_rng(1234)
        draws: dict[str, list[float]] = {}
        for _ in range(NOISE_DRAWS // c):
            if s is None:
                counts, floats = draw_noise(plan, c, d, rng)
            else:
                counts, floats = _kept_distributed(plan, meta, params, s, rng)
            draws.setdefault("counts", []).extend(counts.tolist())
            for seg in schema_for("pooled").float_layout(c, d):
                part = floats[seg.offset:seg.stop]
                scales = entry_scales("pooled", seg.name, c, d)
                if scales is not None:  # off-diagonal entries carry sigma/sqrt(2) (N2s)
                    part = part / scales
                draws.setdefault(seg.name, []).extend(part[:c].tolist())
        for block, values in draws.items():
            n = len(values)
            sd = float(np.std(values))
            lo, hi = (math.sqrt(chi2.ppf(q, n) / n) for q in (0.0005, 0.9995))
            sigma = plan.sigma[block]
            out.append({"dp_mode": dp_mode, "survivors": s, "block": block, "n": n,
                        "sigma": sigma, "empirical": sd, "ratio": sd / sigma,
                        "ratio_interval": [lo, hi], "ok": lo <= sd / sigma <= hi})
    return out


def _gaps(grid: list[dict[str, Any]]) -> list[list[str]]:
    """Distributed minus central mean accuracy (points) per clients and ε."""
    central = {(r.get("clients", CLIENTS), r["epsilon"]): r for r in grid
               if r["dp_mode"] == "central"}
    rows = []
    for r in grid:
        key = (r.get("clients", CLIENTS), r["epsilon"])
        if r["dp_mode"] != "distributed" or r["epsilon"] is None or key not in central:
            continue
        gap = {h: 100 * (statistics.fmean(r["accuracy"][h])
                         - statistics.fmean(central[key]["accuracy"][h])) for h in HEADS}
        mean = statistics.fmean(gap[h] for h in GAP_HEADS)
        per_seed = [[100 * statistics.fmean(row["accuracy"][h][i] for h in GAP_HEADS)
                     for i in range(len(row["accuracy"][GAP_HEADS[0]]))]
                    for row in (r, central[key])]
        cmp = within(per_seed[0], per_seed[1], 0.5, scale=1.0)
        kept = r.get("kept_variance")
        rows.append([str(key[0]), f"{r['epsilon']:g}",
                     "-" if kept is None else f"{kept:.4f}",
                     *(f"{gap[h]:+.1f}" for h in HEADS), f"{mean:+.2f} ± {cmp.se:.2f}",
                     "undecided" if cmp.passed is None else "yes" if cmp.passed else "NO"])
    return rows


def _accuracy_rows(grid: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in grid:
        eps = "∞" if r["epsilon"] is None else f"{r['epsilon']:g}"
        rows.append([str(r.get("clients", CLIENTS)), r["dp_mode"], eps] + [
            fmt_mean_se(r["accuracy"][h]) if r.get("se") else
            f"{100 * statistics.fmean(r['accuracy'][h]):.1f} ± "
            f"{100 * statistics.stdev(r['accuracy'][h]):.1f}" for h in HEADS])
    return rows


def render(result: dict[str, Any]) -> str:
    grid = result["grid"] + result.get("scale_grid", [])
    check = [[c["dp_mode"], "-" if c.get("survivors") is None else str(c["survivors"]),
              c["block"], c["n"], f"{c['sigma']:.4g}", f"{c['empirical']:.4g}",
              f"{c['ratio']:.4f}", f"[{c['ratio_interval'][0]:.4f}, {c['ratio_interval'][1]:.4f}]",
              "yes" if c["ok"] else "NO"] for c in result["noise_check"]]
    cfg = result["config"]
    return "\n".join([
        "## Differential privacy: accuracy vs ε (`benchmarks/bench_dp.py`)",
        "",
        f"CIFAR-10, EfficientNet-Lite0 @224 features ({cfg['train_per_class']} train / "
        f"{cfg['test_per_class']} test images per class), {CLIENTS} and {SCALE_CLIENTS} clients "
        f"(Dirichlet α=0.5), full mode in a public projection to k={PROJECTION_DIM}, clip "
        f"R={cfg['clip']:g} ({cfg.get('clip_rule', 'the default bound')}), δ={DELTA:g}, "
        "add/remove-one-sample DP of the single release, "
        f"{cfg.get('split', 'equal')} budget split over the blocks (counts, sums, class "
        f"scatter; `auto`: ghofl.privacy.split, told the training set's size), σ/√2 off the "
        f"diagonal of the noised matrices ({cfg.get('off_diagonal', 'not yet')}), "
        f"minimum-count rule off "
        f"(k=1). Central: plain sum, the server noises the total. Distributed: secure "
        f"aggregation (t={THRESHOLD} at {CLIENTS} clients, the default t=67 at {SCALE_CLIENTS}); "
        f"each client adds a base share σ²/n and removable dropout levels, the server removes "
        f"the levels released at the survivor count (docs/privacy.md), so the noise kept is σ² "
        f"as in central mode. Accuracy (%) mean ± "
        f"{'standard error' if all(r.get('se') for r in grid) else 'std'} over seeds "
        f"{cfg.get('seeds', list(SEEDS))} (partition, "
        + ("each (seed, ε) its own simulation seed SeedSequence([seed, round(1000 ε)]), so the "
           "ε rows draw independent noise; " if cfg.get("seed_per_epsilon") else "") +
        f"noise, trainable heads; FisherMix and Proto-Hyper with {EPOCHS} epochs). Generated by "
        f"`benchmarks/bench_dp.py` ({result['seconds']:.0f} s, {result['machine']}).",
        "",
        markdown_table(["clients", "mode", "ε", *HEADS], _accuracy_rows(grid)),
        "",
        "Distributed minus central (accuracy points, means over the seeds; `kept σ²`: noise "
        "variance left in the distributed sum, in units of the central σ²). Target: within "
        f"0.5 points, read on the mean over {', '.join(GAP_HEADS)} (nb and qda vary by 2-12 "
        "points between seeds at these ε), ± its standard error over the seeds: the two modes "
        "draw different noise of the same law, so the gap is a difference of two seed means. "
        "Decided by `ghofl.bench.decide.within` (the rule of every DP section): within when "
        "|gap| ≤ max(0.5, 2 standard errors of the gap).",
        "",
        markdown_table(["clients", "ε", "kept σ²", *HEADS, "mean (target heads)",
                        "within 0.5"], _gaps(grid)),
        "",
        f"Empirical check of the noise ({NOISE_DRAWS} draws per block, seeded, ε=1, pooled "
        f"mode, R={cfg['clip']:g}; distributed: the noise kept in a sum over s of n={CLIENTS} "
        f"clients, t={THRESHOLD}, after the levels released at s are removed). `interval`: "
        "two-sided 99.9 % chi-square interval of std/σ.",
        "",
        markdown_table(["mode", "s", "block", "draws", "σ", "empirical std", "std/σ",
                        "interval", "within"], check),
    ])


def measure(ctx: harness.Context) -> dict[str, Any]:
    """The noise check, then the accuracy grid (central, then distributed; ε; seeds)."""
    t0 = time.perf_counter()
    data_dir = ctx.data_dir()
    cfg = config_from_dict({"datasets": ["cifar10"], "train_per_class": 300,
                            "test_per_class": 100, "data_dir": data_dir})
    feats = load_features("cifar10", "efficientnet-lite0", cfg)
    found = recommended_clip_norm(feats.encoder_info, dp=True)
    assert found is not None
    clip = found[0]
    result: dict[str, Any] = {
        "config": {"train_per_class": 300, "test_per_class": 100, "clients": CLIENTS,
                   "threshold": THRESHOLD, "projection_dim": PROJECTION_DIM, "clip": clip,
                   "scale_clients": SCALE_CLIENTS, "scale_epsilons": list(SCALE_EPSILONS),
                   "clip_rule": "the encoder's bound for DP, its median public norm",
                   "delta": DELTA, "seeds": list(SEEDS), "heads": list(HEADS),
                   "trainable_epochs": EPOCHS, "split": "auto", "off_diagonal": "yes",
                   "seed_per_epsilon": True},
        "noise_check": noise_check(clip),
        "grid": accuracy_grid(feats, clip),
        "scale_grid": accuracy_grid(feats, clip, SCALE_CLIENTS, SCALE_EPSILONS, None),
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
