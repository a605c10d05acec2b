"""The paper's multi-round comparison: FedAvg of a linear softmax head (Flower's own FedAvg
strategy, simulation engine) on the same frozen CIFAR-10 features and the same Dirichlet
clients as the one-shot heads. Writes benchmarks/results/fedavg.json, benchmarks/results/
fedavg.png and the ``fedavg`` section of BENCHMARKS.md.

For each α: the one-shot heads (in process, plain sum; the secure sum gives the same
predictions, see the secure aggregation section), then FedAvg for ``--rounds`` rounds with the
learning rate chosen on a held-out tenth of the training set (in process, a short run per
candidate), accuracy after every round on the test set, and the rounds and bytes FedAvg needs
to reach the GH-LDA head's one-shot accuracy (or its gap after 50 and 200 rounds).

Run: ``.venv/bin/python benchmarks/bench_fedavg.py`` (needs ``GHOFL_DATA_DIR`` or
../shared/data, and the ``flower`` extra; about 15 minutes on 2 cores when the CIFAR-10
embeddings are cached); ``--report-only`` (or ``--render-only``) rewrites the section and the
plot from the saved results. Resumable: every finished α is saved to
``benchmarks/results/fedavg_parts.json`` with the settings it ran with and the commit it
measured, and a later run with the same settings runs only the α values missing (``--fresh``
runs them all again). A Flower run that has not finished within 120 s + 6 s per round is
stopped and tried once more.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.baselines import fedavg_rounds, softmax_accuracy
from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.client.job import ClientJob
from ghofl.data.partition import dirichlet_partition
from ghofl.server.job import ServerJob
from ghofl.server.plan import FederationPlan
from ghofl.server.simulation import Population, simulate

ROOT = Path(__file__).resolve().parents[1]
PARTS = "fedavg_parts.json"
HEADS = ("nb", "lda", "qda", "fedcgs", "fishermix", "protohyper")
LR_GRID = (0.003, 0.01, 0.03, 0.1)


def features(per_class: tuple[int, int], data_dir: str | None) -> Any:
    from ghofl.bench.config import config_from_dict
    from ghofl.bench.features import load_features

    cfg = config_from_dict({"datasets": ["cifar10"], "train_per_class": per_class[0],
                            "test_per_class": per_class[1], "data_dir": data_dir})
    return load_features("cifar10", "efficientnet-lite0", cfg, progress=True, log=print)


def choose_lr(x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], c: int, rounds: int,
              seed: int) -> tuple[float, dict[str, float]]:
    """Pick the learning rate by FedAvg in process on 90% of each client's rows, scored on the
    held-out 10% (no test data)."""
    rng = np.random.default_rng(seed)
    fit_parts, held = [], []
    for idx in parts:
        idx = rng.permutation(idx)
        cut = max(1, idx.size // 10) if idx.size > 1 else 0
        held.append(idx[:cut])
        fit_parts.append(idx[cut:])
    held_idx = np.concatenate(held)
    scores = {}
    for lr in LR_GRID:
        params = fedavg_rounds(x, y, fit_parts, c, rounds=rounds, lr=lr, seed=seed)
        scores[str(lr)] = softmax_accuracy(params, x[held_idx], y[held_idx])
    best = max(LR_GRID, key=lambda lr: scores[str(lr)])
    return best, scores


def run_alpha(feats: Any, alpha: float, clients: int, rounds: int, seed: int) -> dict[str, Any]:
    from ghofl.integrations.flower.runner import FlowerRunError, run_local

    c = len(feats.classes)
    plan = FederationPlan(ClientJob(tuple(feats.classes), "full"),
                          server=ServerJob(HEADS, seed=seed))
    one_shot = simulate(plan, (feats.x_train, feats.y_train), (feats.x_test, feats.y_test),
                        Population(clients, alpha, encoder=feats.encoder_info))
    parts = dirichlet_partition(feats.y_train, clients, alpha, seed)
    lr, lr_scores = choose_lr(np.asarray(feats.x_train, np.float64), feats.y_train, parts, c,
                              rounds=20, seed=seed)
    print(f"alpha={alpha}: learning rate {lr} (held-out scores {lr_scores})", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "parts").mkdir()
        for i, idx in enumerate(parts):
            np.savez(root / "parts" / f"client-{i}.npz", x=feats.x_train[idx],
                     y=feats.y_train[idx])
        np.savez(root / "test.npz", x=feats.x_test, y=feats.y_test)
        config = {"test-path": str(root / "test.npz"), "out-dir": str(root / "out"),
                  "num-classes": c, "dim": int(feats.x_train.shape[1]), "num-rounds": rounds,
                  "local-epochs": 1, "lr": lr, "batch-size": 64, "seed": seed,
                  "wait-timeout-s": 300.0, "round-timeout-s": 600.0}
        for attempt in (1, 2):
            work = root / f"work-{attempt}"
            print(f"alpha={alpha}: Flower run (attempt {attempt}; logs in {work})", flush=True)
            try:
                res = run_local("simulation", clients, config, work,
                                data_template=str(root / "parts" / "client-{partition_id}.npz"),
                                app_dir=ROOT / "examples" / "flower_fedavg",
                                timeout_s=120.0 + 6.0 * rounds)
                break
            except FlowerRunError as exc:
                if attempt == 2:
                    raise
                print(f"alpha={alpha}: the Flower run failed ({str(exc)[:300]}); trying again",
                      flush=True)
    acc = res["accuracy"]
    print(f"alpha={alpha}: FedAvg {100 * acc[-1]:.2f}% after {rounds} rounds "
          f"({res.get('wall_s') or 0.0:.0f} s)", flush=True)
    target = one_shot.heads["lda"].accuracy
    reached = next((r for r, a in enumerate(acc) if a >= target), None)
    return {
        "alpha": alpha, "clients": clients, "lr": lr, "lr_scores": lr_scores,
        "one_shot": {h: r.accuracy for h, r in one_shot.heads.items()},
        "one_shot_upload_bytes_per_client": one_shot.upload_bytes_per_client,
        "fedavg_accuracy": acc, "fedavg_seconds": res["seconds"],
        "bytes_per_client_per_round": res["bytes_per_client_per_round"],
        "rounds_to_lda": reached,
        "bytes_to_lda_per_client": None if reached is None
        else reached * res["bytes_per_client_per_round"],
        "gap_at": {str(r): acc[r] - target for r in (50, 200) if r < len(acc)},
        "wall_s": res.get("wall_s"),
    }


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        acc = 100 * np.asarray(r["fedavg_accuracy"])
        ax.plot(np.arange(acc.size), acc, color="black", label="FedAvg (linear head)")
        for i, (head, a) in enumerate(r["one_shot"].items()):
            ax.axhline(100 * a, ls="--", lw=1, color=f"C{i}", label=f"{head} (one shot)")
        ax.set_xlabel("FedAvg round")
        ax.set_ylabel("test accuracy %")
        ax.set_title(f"CIFAR-10, {r['clients']} clients, α = {r['alpha']}")
        ax.set_ylim(max(0.0, float(acc.min()) - 5), 100 * max(r["one_shot"].values()) + 5)
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(data: dict[str, Any]) -> str:
    res = data["runs"]
    pooled_bytes = _pooled_bytes(data)
    lines = ["## FedAvg vs the one-shot heads (`benchmarks/bench_fedavg.py`)", "",
             f"Machine: {data['machine']}. CIFAR-10, EfficientNet-Lite0 at 224 "
             f"({data['n_train']:,} training / {data['n_test']:,} test images), "
             f"{res[0]['clients']} Dirichlet clients, seed 0. FedAvg: Flower's FedAvg strategy "
             "(flwr 1.42, simulation engine) on a linear softmax head, 1 local epoch of "
             "mini-batch SGD (batch 64), learning rate chosen per α on a held-out tenth of "
             "the training rows; accuracy of the global weights on the test set after every "
             "round. One-shot heads: one upload of mode `full` statistics.", ""]
    rows = []
    for r in res:
        per = r["bytes_per_client_per_round"]
        reach = ("never" if r["rounds_to_lda"] is None
                 else f"{r['rounds_to_lda']} rounds ({r['bytes_to_lda_per_client'] / 1e6:.2f} MB"
                      " per client)")
        gaps = ", ".join(f"{100 * g:+.2f} after {k}"
                         for k, g in sorted(r["gap_at"].items(), key=lambda kv: int(kv[0])))
        rows.append([r["alpha"], f"{100 * r['one_shot']['lda']:.2f}",
                     f"{100 * max(r['one_shot'].values()):.2f}",
                     f"{100 * r['fedavg_accuracy'][-1]:.2f}", r["lr"], reach, gaps or "-",
                     f"{per / 1e3:.1f}",
                     f"{r['one_shot_upload_bytes_per_client'] / 1e6:.1f}",
                     f"{pooled_bytes / 1e6:.1f}"])
    lines.append(markdown_table(
        ["α", "GH-LDA one shot %", "best one-shot head %",
         f"FedAvg after {len(res[0]['fedavg_accuracy']) - 1} rounds %", "FedAvg lr",
         "FedAvg reaches GH-LDA after", "FedAvg − GH-LDA (points)",
         "FedAvg kB per client per round", "one-shot MB per client (once, `full`)",
         "GH-LDA alone: MB per client (once, `pooled`)"], rows))
    lines += ["", "![FedAvg vs one-shot heads](benchmarks/results/fedavg.png)"]
    return "\n".join(lines)


def _pooled_bytes(data: dict[str, Any]) -> int:
    """Bytes one client uploads in mode ``pooled`` (enough for GH-LDA) at this C and d."""
    from ghofl.stats.schema import schema_for

    return schema_for("pooled").nbytes(int(data.get("num_classes", 10)),
                                       int(data.get("dim", 1280)))


def _plot(data: dict[str, Any], results_dir: Path) -> None:
    plot(data["runs"], results_dir / "fedavg.png")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write / --out)."""
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.05, 0.5])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--train-per-class", type=int, default=0)
    ap.add_argument("--test-per-class", type=int, default=0)
    ap.add_argument("--fresh", action="store_true",
                    help=f"run every α again, ignoring the α values saved in {PARTS}")


def measure(ctx: harness.Context) -> dict[str, Any]:
    """The one-shot heads and FedAvg at each α (seed 0)."""
    args = ctx.args
    feats = features((args.train_per_class, args.test_per_class), ctx.data_dir())
    settings = {"clients": args.clients, "rounds": args.rounds,
                "train_per_class": args.train_per_class, "test_per_class": args.test_per_class}
    saved = ctx.load(PARTS, {})
    done = saved.get("runs", {}) if saved.get("settings") == settings and not args.fresh else {}
    if done:
        ctx.log(f"resuming: {', '.join(sorted(done))} saved in {PARTS} with these settings")

    def run_row(alpha: float) -> dict[str, Any]:
        return {**run_alpha(feats, alpha, args.clients, args.rounds, seed=0),
                "code": ctx.code_version()}

    by_key = harness.run_rows(args.alphas, _key, run_row, done,
                              lambda out: ctx.save(PARTS, {"settings": settings, "runs": out}))
    runs = [by_key[_key(a)] for a in args.alphas]
    data = {"machine": machine_summary(), "runs": runs, "n_train": int(feats.y_train.size),
            "n_test": int(feats.y_test.size), "dim": int(feats.x_train.shape[1]),
            "num_classes": len(feats.classes),
            # the commit each α measured (a resumed run keeps earlier ones): the section names them
            "parts": {_key(a): {"code": r["code"]} if r.get("code") else {}
                      for a, r in zip(args.alphas, runs, strict=True)}}
    data["pooled_bytes"] = _pooled_bytes(data)
    return {"fedavg": data}


def _key(alpha: float) -> str:
    return f"alpha={alpha:g}"


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("fedavg", "fedavg.json", render, after_render=_plot),),
    measure=measure,
    add_arguments=add_arguments,
    report_aliases=("--render-only",),
    child_processes=True,
)

if __name__ == "__main__":
    harness.main(BENCH)
