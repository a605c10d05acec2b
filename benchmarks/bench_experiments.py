"""Run the experiment configs under benchmarks/configs with the experiment runner and write their
tables into BENCHMARKS.md (one section per config) plus results under benchmarks/results/NAME/.

Run: ``.venv/bin/python benchmarks/bench_experiments.py cifar10_main text upload_size``
(`--resume` continues an interrupted run; no config names: only the summary is rewritten;
``--report-only`` rewrites every section from the saved results). Needs the real data
(GHOFL_DATA_DIR) and the ``torch``, ``text`` and ``bench`` extras. The first run embeds the
datasets (about 15 minutes for CIFAR-10 at 224 px on 2 cores); later runs read the embedding
cache.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from ghofl.bench import harness
from ghofl.bench.config import load_config
from ghofl.bench.report import machine_summary, markdown_table
from ghofl.bench.runner import run_experiment
from ghofl.bench.tables import accuracy_tables, invariance_summary
from ghofl.heads.registry import available_heads

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "benchmarks" / "configs"
GH_HEADS = ("nb", "lda", "qda", "fishermix", "protohyper")
SUMMARY = "experiment-summary"


def headline(records: list[dict[str, Any]]) -> str:
    """Best GH head (mean over every federation) vs the centralised probes, per dataset."""
    rows = []
    by_ds: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_ds[(r["dataset"], r["encoder"])].append(r)
    for (ds, enc), recs in by_ds.items():
        fed = [r for r in recs if r["mode"] != "reference" and not r["projection_dim"]]
        means = {
            h: statistics.fmean(r["accuracy"] for r in fed if r["head"] == h)
            for h in dict.fromkeys(r["head"] for r in fed)
        }
        gh = {h: v for h, v in means.items() if h in GH_HEADS}
        refs = {r["head"]: r["accuracy"] for r in recs if r["mode"] == "reference"}
        if not gh:
            continue
        best = max(gh, key=lambda h: gh[h])  # a tie goes to the head first in the records
        row = [
            ds,
            enc,
            best,
            f"{100 * gh[best]:.2f}",
            f"{100 * means['fedcgs']:.2f}" if "fedcgs" in means else "-",
        ]
        for ref in ("logreg", "sklearn_lda"):
            row.append(f"{100 * refs[ref]:.2f}" if ref in refs else "-")
        row.append(f"{100 * (gh[best] - refs['logreg']):+.2f}" if "logreg" in refs else "-")
        rows.append(row)
    return markdown_table(
        [
            "dataset",
            "encoder",
            "best GH head",
            "its accuracy %",
            "FedCGS %",
            "logreg (centralised) %",
            "sklearn LDA (centralised) %",
            "best GH − logreg (points)",
        ],
        rows,
    )


def bytes_table(records: list[dict[str, Any]]) -> str:
    """Accuracy of every head per (mode, projection), with the upload size: accuracy vs bytes."""
    fed = [r for r in records if r["mode"] != "reference"]
    combos = sorted(
        {(r["mode"], r["projection_dim"] or 0) for r in fed},
        key=lambda mk: (mk[0] != "full", -(mk[1] or 10**9)),
    )
    if len(combos) < 2:
        return ""
    heads = list(dict.fromkeys(r["head"] for r in fed))
    rows = []
    for mode, k in combos:
        recs = [r for r in fed if r["mode"] == mode and (r["projection_dim"] or 0) == k]
        acc = {
            h: statistics.fmean(r["accuracy"] for r in recs if r["head"] == h)
            for h in heads
            if any(r["head"] == h for r in recs)
        }
        rows.append(
            [mode, k or "-", f"{recs[0]['upload_bytes_per_client'] / 1e6:.2f}"]
            + [f"{100 * acc[h]:.2f}" if h in acc else "n/a" for h in heads]
        )
    return "Accuracy vs upload size:\n\n" + markdown_table(
        ["mode", "projection k", "MB per client", *heads], rows
    )


def stage_summary(records: list[dict[str, Any]]) -> str:
    """Median server seconds per head (fit) across the grid."""
    fit: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r["mode"] != "reference":
            fit[r["head"]].append(r["fit_seconds"])
    return markdown_table(
        ["head", "median fit seconds", "federations"],
        [[h, f"{statistics.median(v):.2f}", len(v)] for h, v in fit.items()],
    )


def summary(results_root: Path) -> str:
    """One row per (config, dataset, encoder, mode, projection) over every results.json:
    each head's mean accuracy, the upload size and the centralised probes on the same features."""
    rows = []
    heads_seen: list[str] = []
    for path in sorted(results_root.glob("*/results.json")):
        recs = json.loads(path.read_text())["records"]
        for r in recs:
            if r["mode"] != "reference" and r["head"] not in heads_seen:
                heads_seen.append(r["head"])
    order = {h: i for i, h in enumerate(available_heads())}
    heads_seen.sort(key=lambda h: order.get(h, len(order)))
    for path in sorted(results_root.glob("*/results.json")):
        name = path.parent.name
        recs = json.loads(path.read_text())["records"]
        refs = {
            (r["dataset"], r["encoder"], r["head"]): r["accuracy"]
            for r in recs
            if r["mode"] == "reference"
        }
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
        for r in recs:
            if r["mode"] != "reference":
                groups[(r["dataset"], r["encoder"], r["mode"], r["projection_dim"])].append(r)
        for (ds, enc, mode, proj), g in groups.items():
            row: list[Any] = [
                name,
                ds,
                enc,
                mode,
                proj or "-",
                f"{g[0]['upload_bytes_per_client'] / 1e6:.2f}",
                len(g) // len({r["head"] for r in g}),
            ]
            for h in heads_seen:
                accs = [r["accuracy"] for r in g if r["head"] == h]
                row.append(f"{100 * statistics.fmean(accs):.2f}" if accs else "")
            lr = refs.get((ds, enc, "logreg"))
            row.append(f"{100 * lr:.2f}" if lr is not None else "")
            rows.append(row)
    return "\n".join(
        [
            "## Summary of all experiments (`benchmarks/bench_experiments.py`)",
            "",
            "Mean test accuracy % of each head over every federation of the group (all α, client "
            "counts and seeds: the heads are partition invariant, so the spread comes from the "
            "seeds of the trainable heads only; see each experiment's section). `logreg` is the "
            "centralised logistic-regression probe on the same features (C by cross-validation on "
            "train). Encoder names with `+sqrt` / `+x+sqrt` use a client-side feature transform "
            "(`ghofl.client.transforms`).",
            "",
            markdown_table(
                [
                    "config",
                    "dataset",
                    "encoder",
                    "mode",
                    "proj k",
                    "MB/client",
                    "federations",
                    *heads_seen,
                    "logreg (centralised)",
                ],
                rows,
            ),
        ]
    )


def render_experiment(name: str, data: dict[str, Any]) -> str:
    """The section of config ``name`` from its results.json (``machine`` and ``date`` added)."""
    records = data["records"]
    wall = data["wall_seconds"]  # over resumes
    return "\n".join(
        [
            f"## Experiment `{name}` (`benchmarks/configs/{name}.toml`, "
            "`benchmarks/bench_experiments.py`)",
            "",
            f"Machine: {data['machine']}. Measured {data['date']}; "
            "the grid took "
            f"{wall / 60:.1f} min (embeddings from the cache when present). Full records: "
            f"`benchmarks/results/{name}/results.json`; plots beside it.",
            "",
            headline(records),
            "",
            accuracy_tables(records),
            "",
            invariance_summary(records),
            "",
            "Server fit time per head (median over the grid):",
            "",
            stage_summary(records),
        ]
    )


def _results(path: Path) -> Any:
    """A config's results.json (written by the experiment runner, never by the harness)."""
    return json.loads(path.read_text())


def _folder(path: Path) -> Path:
    return path


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags of this benchmark (besides the harness's --report-only / --no-write / --out)."""
    ap.add_argument(
        "configs",
        nargs="*",
        help="config names in benchmarks/configs (without .toml); none: only "
        "rewrite the summary from the existing results",
    )
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--progress", action="store_true")


def measure(ctx: harness.Context) -> dict[str, Any]:
    """Run each named config (the runner writes benchmarks/results/NAME/), then the summary."""
    args = ctx.args
    out: dict[str, Any] = {}
    for name in args.configs:
        BENCH.section(f"experiment-{name}")  # an unknown name fails before any run
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.configs:
            cfg = load_config(CONFIGS / f"{name}.toml")
            folder = ctx.results_dir / name
            if args.no_write:  # the runner writes its files: into a scratch copy then
                if args.resume and folder.is_dir():
                    shutil.copytree(folder, Path(scratch) / name)
                folder = Path(scratch) / name
            records = run_experiment(
                cfg,
                folder,
                resume=args.resume,
                progress=args.progress,
                log=lambda m: print(m, file=sys.stderr, flush=True),
            )
            out[f"experiment-{name}"] = {
                **_results(folder / "results.json"),  # its wall_seconds count every resume
                "records": records,
                "machine": machine_summary(),
                "date": time.strftime("%Y-%m-%d"),
            }
    out[SUMMARY] = ctx.results_dir
    return out


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(
        harness.Section(SUMMARY, "", summary, first=True, load=_folder),
        *(
            harness.Section(f"experiment-{p.stem}", f"{p.stem}/results.json",
                            functools.partial(render_experiment, p.stem), load=_results,
                            states_machine=True)
            for p in sorted(CONFIGS.glob("*.toml"))
        ),
    ),
    measure=measure,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
