"""Ablation of the trainable heads on real CIFAR-10 features (EfficientNet-Lite0, 224 px, full
50k/10k): Proto-Hyper's teacher (informative vs the paper's), fixed vs fresh synthetic samples,
residual rank, and FisherMix's initialisation and variant. One aggregate (the heads are partition
invariant), 3 training seeds per variant. Writes benchmarks/results/ablation_cifar10.json and the
``ablation_cifar10`` section of BENCHMARKS.md.

Run: ``.venv/bin/python benchmarks/bench_ablation_cifar10.py`` (a few minutes once the
embeddings are cached; needs GHOFL_DATA_DIR); ``--report-only`` rewrites the section from the
saved results.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table

SEEDS = (0, 1, 2)
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("Proto-Hyper, informative teacher (default)", "protohyper", {}),
    ("Proto-Hyper, paper teacher", "protohyper", {"teacher": "paper"}),
    ("Proto-Hyper, fresh samples every epoch", "protohyper", {"fresh_samples": True}),
    ("Proto-Hyper, rank 2", "protohyper", {"rank": 2}),
    ("Proto-Hyper, rank 4", "protohyper", {"rank": 4}),
    ("Proto-Hyper, rank k_f − 1", "protohyper", {"rank": None}),
    ("FisherMix, LDA init (default)", "fishermix", {}),
    ("FisherMix, random init (paper)", "fishermix", {"init": "random"}),
    ("FisherMix, fresh samples every epoch", "fishermix", {"fresh_samples": True}),
    ("FisherMix, cosine classifier", "fishermix", {"variant": "cosine"}),
]
REFERENCES = ("lda", "qda")


def measure(ctx: harness.Context) -> dict[str, Any]:
    """Every variant over the seeds (rows of the results list) and the closed-form references.

    The results list keeps one entry per variant; the references are entries with
    ``"reference": true`` and one accuracy, and each entry records its ``note``.
    """
    from ghofl.bench.config import ExperimentConfig
    from ghofl.bench.features import load_features
    from ghofl.heads import make_head
    from ghofl.moments import compute_moments
    from ghofl.stats import compute_stats

    cfg = ExperimentConfig(datasets=("cifar10",), encoders=("efficientnet-lite0",))
    feats = load_features("cifar10", "efficientnet-lite0", cfg)
    moments = compute_moments(compute_stats(feats.x_train, feats.y_train, feats.classes))
    out: list[dict[str, Any]] = []
    for ref in REFERENCES:
        acc = make_head(ref).fit_from_moments(moments).score(feats.x_test, feats.y_test)
        out.append({"variant": f"{ref.upper()} (closed form, reference)", "head": ref,
                    "params": {}, "reference": True, "accuracy": [acc], "fit_seconds": [],
                    "note": ""})

    def run_row(row: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
        label, head, params = row
        accs, secs, note = [], [], ""
        for seed in SEEDS:
            h = make_head(head, seed=seed, **params)
            t0 = time.perf_counter()
            h.fit_from_moments(moments)
            secs.append(time.perf_counter() - t0)
            accs.append(h.score(feats.x_test, feats.y_test))
            if head == "protohyper":
                note = f"teacher KL to base {getattr(h, 'teacher_base_kl_', float('nan')):.2g}"
        return {"variant": label, "head": head, "params": params, "accuracy": accs,
                "fit_seconds": secs, "note": note, "machine": machine_summary()}

    rows = harness.run_rows(VARIANTS, key=lambda v: v[0], run_row=run_row)
    return {"ablation_cifar10": {"entries": out + list(rows.values())}}


def render(results: dict[str, Any] | list[dict[str, Any]]) -> str:
    """The section from the results (the machine of the first entry that records it).

    ``{"entries": [...], "code": ...}``; results saved before the code was recorded are the
    bare list of entries.
    """
    entries = results["entries"] if isinstance(results, dict) else results
    rows = []
    for e in entries:
        if e.get("reference"):
            rows.append([e["variant"], f"{100 * e['accuracy'][0]:.2f}", "", ""])
            continue
        m, s = statistics.fmean(e["accuracy"]), statistics.stdev(e["accuracy"])
        rows.append([e["variant"], f"{100 * m:.2f} ± {100 * s:.2f}",
                     f"{statistics.median(e['fit_seconds']):.1f}", e.get("note", "")])
    machine = next((e["machine"] for e in entries if e.get("machine")), "")
    return "\n".join([
        "## Ablation of the trainable heads on CIFAR-10 features "
        "(`benchmarks/bench_ablation_cifar10.py`)",
        "",
        f"Machine: {machine}. EfficientNet-Lite0 at 224 px, 50k train statistics "
        f"(mode `full`), 10k test images; every variant at the paper's CIFAR-10 defaults except "
        f"what its row names; mean ± std over training seeds {list(SEEDS)}.",
        "",
        markdown_table(["variant", "test accuracy %", "fit s (median)", "note"], rows),
    ])


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("ablation_cifar10", "ablation_cifar10.json", render),),
    measure=measure,
)

if __name__ == "__main__":
    harness.main(BENCH)
