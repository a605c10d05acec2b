"""Ablation of the trainable heads on real CIFAR-10 features (EfficientNet-Lite0, 224 px, full
50k/10k): Proto-Hyper's teacher (informative vs the paper's), fixed vs fresh synthetic samples,
residual rank, and FisherMix's initialisation and variant. One aggregate (the heads are partition
invariant), 3 training seeds per variant. Writes benchmarks/results/ablation_cifar10.json and the
``ablation_cifar10`` section of BENCHMARKS.md.

Run: ``.venv/bin/python benchmarks/bench_ablation_cifar10.py`` (a few minutes once the
embeddings are cached; needs GHOFL_DATA_DIR).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from ghofl.bench.config import ExperimentConfig
from ghofl.bench.features import load_features
from ghofl.bench.report import machine_summary, markdown_table, update_section, write_json
from ghofl.heads import make_head
from ghofl.moments import compute_moments
from ghofl.stats import compute_stats

ROOT = Path(__file__).resolve().parents[1]
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


def main() -> None:
    cfg = ExperimentConfig(datasets=("cifar10",), encoders=("efficientnet-lite0",))
    feats = load_features("cifar10", "efficientnet-lite0", cfg)
    moments = compute_moments(compute_stats(feats.x_train, feats.y_train, feats.classes))
    rows, out = [], []
    for ref in ("lda", "qda"):
        acc = make_head(ref).fit_from_moments(moments).score(feats.x_test, feats.y_test)
        rows.append([f"{ref.upper()} (closed form, reference)", f"{100 * acc:.2f}", "", ""])
    for label, head, params in VARIANTS:
        accs, secs, extra = [], [], ""
        for seed in SEEDS:
            h = make_head(head, seed=seed, **params)
            t0 = time.perf_counter()
            h.fit_from_moments(moments)
            secs.append(time.perf_counter() - t0)
            accs.append(h.score(feats.x_test, feats.y_test))
            if head == "protohyper":
                extra = f"teacher KL to base {getattr(h, 'teacher_base_kl_', float('nan')):.2g}"
        m, s = statistics.fmean(accs), statistics.stdev(accs)
        rows.append([label, f"{100 * m:.2f} ± {100 * s:.2f}", f"{statistics.median(secs):.1f}",
                     extra])
        out.append({"variant": label, "head": head, "params": params, "accuracy": accs,
                    "fit_seconds": secs})
    write_json(ROOT / "benchmarks" / "results" / "ablation_cifar10.json", out)
    body = "\n".join([
        "## Ablation of the trainable heads on CIFAR-10 features "
        "(`benchmarks/bench_ablation_cifar10.py`)",
        "",
        f"Machine: {machine_summary()}. EfficientNet-Lite0 at 224 px, 50k train statistics "
        f"(mode `full`), 10k test images; every variant at the paper's CIFAR-10 defaults except "
        f"what its row names; mean ± std over training seeds {list(SEEDS)}.",
        "",
        markdown_table(["variant", "test accuracy %", "fit s (median)", "note"], rows),
    ])
    update_section(ROOT / "BENCHMARKS.md", "ablation_cifar10", body)
    print(body)


if __name__ == "__main__":
    main()
