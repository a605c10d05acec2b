"""Run the experiment configs under benchmarks/configs with the experiment runner and write their
tables into BENCHMARKS.md (one section per config) plus results under benchmarks/results/NAME/.

Run: ``.venv/bin/python benchmarks/bench_experiments.py cifar10_main text upload_size``
(`--resume` continues an interrupted run; no config names: only the summary is rewritten;
``--report-only`` rewrites every section from the saved results). Needs the real data
(GHOFL_DATA_DIR) and the ``torch``, ``text`` and ``bench`` extras. The first run embeds the
datasets (about 15 minutes for CIFAR-10 at 224 px on 2 cores); later runs read the embedding
cache.

One federation per setting: every head of these grids is fitted from the exact float64 sum of
the clients' statistics (the trainable heads with the grid's fixed seed), so its accuracy does
not depend on how the data is split into clients. A config whose heads are partition invariant
(:func:`partition_invariant`) runs one federation per (dataset, encoder, mode, projection): the
first α, client count and seed of its grid. The invariance itself is measured on the one config
that sets ``invariance_check = true``: it also runs the same federation
on other partitions (:func:`invariance_partitions`) into ``benchmarks/results/NAME/invariance/``
and records each head's accuracy spread over them in ``invariance.json``; every section states
that spread and where it was measured.
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
from dataclasses import replace
from pathlib import Path
from typing import Any

from ghofl.bench import harness
from ghofl.bench.config import ExperimentConfig, load_config
from ghofl.bench.features import Features
from ghofl.bench.provenance import CODE_KEY
from ghofl.bench.report import machine_summary, markdown_table, write_json
from ghofl.bench.runner import run_experiment
from ghofl.bench.tables import accuracy_tables, invariance_summary
from ghofl.errors import ConfigError
from ghofl.heads.registry import available_heads

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "benchmarks" / "configs"
GH_HEADS = ("nb", "lda", "qda", "fishermix", "protohyper")
SUMMARY = "experiment-summary"
#: The config key that makes a config measure the partition invariance.
INVARIANCE_KEY = "invariance_check"
#: Partitions the invariance check compares (the config's federation among them).
INVARIANCE_PARTITIONS = 3
INVARIANCE_FILE = "invariance.json"


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
    single = bool(rows) and all(row[6] == 1 for row in rows)
    return "\n".join(
        [
            "## Summary of all experiments (`benchmarks/bench_experiments.py`)",
            "",
            ("Test accuracy % of each head in the group's one federation (the heads are "
             "partition invariant; each experiment's section states the check). " if single else
             "Mean test accuracy % of each head over every federation of the group (all α, "
             "client counts and seeds: the heads are partition invariant, so the spread comes "
             "from the seeds of the trainable heads only; see each experiment's section). ")
            + "`logreg` is the "
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


# ---------------------------------------------------------------------- one federation
def partition_invariant(cfg: ExperimentConfig) -> bool:
    """Whether every head of ``cfg`` scores the same on every partition of its data.

    Each head is fitted from the total of the clients' statistics, which the plain float64
    sum makes independent of the partition (to rounding); the trainable heads take the
    grid's seed. Not so for the secure protocol (fixed-point words per client) or float32
    uploads (each client's sums rounded).
    """
    return not cfg.secure and set(cfg.transport_dtype) == {"float64"}


def one_federation(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with its first α, client count and seed: one federation per setting."""
    return replace(cfg, alphas=cfg.alphas[:1], clients=cfg.clients[:1], seeds=cfg.seeds[:1])


def federation_grid(cfg: ExperimentConfig, name: str) -> ExperimentConfig:
    """The federations to run of config ``name``: one when its heads are partition invariant.

    Raises
    ------
    ConfigError
        The config asks for the invariance check but its heads are not partition invariant.
    """
    if partition_invariant(cfg):
        return one_federation(cfg)
    if cfg.invariance_check:
        raise ConfigError(f"{name}: {INVARIANCE_KEY} is for a config whose heads are partition "
                          "invariant (plain float64 uploads); drop it or the secure/float32 "
                          "setting")
    return cfg


def invariance_partitions(cfg: ExperimentConfig) -> list[tuple[float, int]]:
    """The (α, clients) settings the check compares: the config's federation first.

    Its first α and client count, then the last α, the last client count, and further
    settings of the grid up to :data:`INVARIANCE_PARTITIONS`.

    Raises
    ------
    ConfigError
        The grid has a single (α, clients) setting: there is nothing to compare.
    """
    first, last = (cfg.alphas[0], cfg.clients[0]), (cfg.alphas[-1], cfg.clients[-1])
    ordered = [first, (last[0], first[1]), (first[0], last[1])]
    ordered += [(a, k) for a in cfg.alphas for k in cfg.clients]
    out = list(dict.fromkeys(ordered))[:INVARIANCE_PARTITIONS]
    if len(out) < 2:
        raise ConfigError(f"{cfg.name}: {INVARIANCE_KEY} needs at least two (alpha, clients) "
                          "settings to compare; give more alphas or clients")
    return out


def check_config() -> str | None:
    """The config under benchmarks/configs that sets ``invariance_check = true`` (or None)."""
    names = [p.stem for p in sorted(CONFIGS.glob("*.toml")) if load_config(p).invariance_check]
    if len(names) > 1:
        raise ConfigError(f"{INVARIANCE_KEY} is set in {', '.join(names)}; set it in one "
                          "config only")
    return names[0] if names else None


def run_invariance(cfg: ExperimentConfig, name: str, folder: Path, first: list[dict[str, Any]],
                   memo: dict[tuple[str, str], Features], args: argparse.Namespace
                   ) -> dict[str, Any]:
    """Run the config's federation on the other partitions; write and return the spread.

    ``first`` holds the records of the config's federation (the first partition).
    """
    parts = invariance_partitions(cfg)
    records = [r for r in first if r["mode"] != "reference"]
    for alpha, clients in parts[1:]:
        one = replace(cfg, alphas=(alpha,), clients=(clients,), seeds=cfg.seeds[:1],
                      references=(), invariance_check=False)
        records += run_experiment(one, folder / "invariance" / f"alpha-{alpha:g}-clients-"
                                  f"{clients}", resume=args.resume, progress=args.progress,
                                  log=lambda m: print(m, file=sys.stderr, flush=True),
                                  features=memo, plots=False)
    by: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for r in records:
        by[(r["dataset"], r["encoder"], r["mode"], r["projection_dim"], r["head"])].append(
            r["accuracy"])
    rows = [{"dataset": k[0], "encoder": k[1], "mode": k[2], "projection_dim": k[3],
             "head": k[4], "accuracies": v, "spread": 100 * (max(v) - min(v))}
            for k, v in by.items()]
    out = {"config": name, "partitions": [[a, k, cfg.seeds[0]] for a, k in parts],
           "rows": rows, "spread": max((r["spread"] for r in rows), default=0.0)}
    write_json(folder / INVARIANCE_FILE, out)
    return out


def read_invariance(results_root: Path) -> dict[str, Any] | None:
    """The saved invariance check (``None``: no config sets the flag, or it has not run)."""
    name = check_config()
    path = results_root / (name or "") / INVARIANCE_FILE
    return json.loads(path.read_text()) if name and path.exists() else None


def federations(records: list[dict[str, Any]]) -> int:
    """The most federations any (dataset, encoder, mode, projection) of ``records`` holds."""
    cells: dict[tuple[Any, ...], set[tuple[Any, ...]]] = defaultdict(set)
    for r in records:
        if r["mode"] != "reference":
            cells[(r["dataset"], r["encoder"], r["mode"], r["projection_dim"])].add(
                (r["alpha"], r["clients"], r["seed"]))
    return max((len(v) for v in cells.values()), default=0)


def invariance_note(records: list[dict[str, Any]], check: dict[str, Any] | None,
                    checker: str | None = None) -> str:
    """What a section says of a grid run as one federation ("" for a full grid).

    ``check``: the saved invariance check; ``checker``: the config that sets
    ``invariance_check`` (for a check that has not run yet).
    """
    fed = [r for r in records if r["mode"] != "reference"]
    if not fed or federations(records) != 1:
        return ""
    r = fed[0]
    head = (f"One federation (α = {r['alpha']:g}, {r['clients']} clients, seed {r['seed']}); "
            "heads are partition invariant")
    if check is None and checker is not None:
        return head + (f", to be checked on `{checker}` (its invariance part has not run yet: "
                       f"benchmarks/bench_experiments.py {checker}).")
    if check is None:
        return head + f", not yet checked (set {INVARIANCE_KEY} = true on one config and run it)."
    parts = "; ".join(f"α = {a:g}, {k} clients" for a, k, _ in check["partitions"])
    return (f"{head}, checked on `{check['config']}`: spread {check['spread']:.4f} points "
            f"(largest accuracy difference of any head over {len(check['partitions'])} "
            f"partitions: {parts}; seed {check['partitions'][0][2]}).")


def invariance_table(check: dict[str, Any]) -> str:
    """The check's spread per head (points), for the section of the config it ran on."""
    return "### Partition invariance\n\nAccuracy spread (points) of each head over the " \
        "partitions above:\n\n" + markdown_table(
            ["dataset", "encoder", "mode", "proj", "head", "accuracies %", "spread"],
            [[r["dataset"], r["encoder"], r["mode"], r["projection_dim"] or "-", r["head"],
              " / ".join(f"{100 * a:.2f}" for a in r["accuracies"]), f"{r['spread']:.4f}"]
             for r in check["rows"]])


def render_experiment(name: str, data: dict[str, Any]) -> str:
    """The section of config ``name`` from its results.json (``machine`` and ``date`` added)."""
    records = data["records"]
    wall = data["wall_seconds"]  # over resumes
    check = data.get("invariance")
    note = invariance_note(records, check, data.get("invariance_config"))
    own = check is not None and check["config"] == name and bool(note)
    return "\n".join(
        [
            f"## Experiment `{name}` (`benchmarks/configs/{name}.toml`, "
            "`benchmarks/bench_experiments.py`)",
            "",
            f"Machine: {data['machine']}. Measured {data['date']}; "
            "the grid took "
            f"{wall / 60:.1f} min (embeddings from the cache when present). Full records: "
            f"`benchmarks/results/{name}/results.json`; plots beside it.",
            *(["", note] if note else []),
            "",
            headline(records),
            "",
            accuracy_tables(records),
            "",
            invariance_table(check) if own and check is not None else invariance_summary(records),
            "",
            "Server fit time per head (median over the grid):",
            "",
            stage_summary(records),
        ]
    )


def _results(path: Path) -> Any:
    """A config's results.json (written by the experiment runner, never by the harness).

    With the saved invariance check (``invariance``), which the section states.
    """
    return {**json.loads(path.read_text()), "invariance": read_invariance(path.parents[1]),
            "invariance_config": check_config()}


def _earlier_code(folder: Path) -> tuple[dict[str, Any] | None] | None:
    """The code record of the results a resumed run keeps (``None``: it keeps none).

    A one-tuple holding the record, or ``None`` in it when those results record none.
    """
    path = folder / "results.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(earlier, dict) or not earlier.get("records"):
        return None
    rec = earlier.get(CODE_KEY)
    return (rec if isinstance(rec, dict) else None,)


def _folder(path: Path) -> dict[str, Any]:
    """The summary's results: the results folder and, per experiment, the code it measured."""
    parts = {}
    for file in sorted(path.glob("*/results.json")):
        saved = json.loads(file.read_text())
        rec = saved.get(CODE_KEY) if isinstance(saved, dict) else None
        parts[file.parent.name] = {CODE_KEY: rec} if isinstance(rec, dict) else {}
    return {"root": str(path), "parts": parts}


def _render_summary(results: dict[str, Any]) -> str:
    return summary(Path(results["root"]))


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
    memo: dict[tuple[str, str], Features] = {}  # each dataset embedded once per run
    check = read_invariance(ctx.results_dir)
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.configs:
            full = load_config(CONFIGS / f"{name}.toml")
            cfg = federation_grid(full, name)
            folder = ctx.results_dir / name
            earlier = _earlier_code(folder) if args.resume else None
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
                features=memo,
            )
            if full.invariance_check:
                check = run_invariance(full, name, folder, records, memo, args)
            # the runner writes results.json; the code it measured is recorded beside its
            # records (with the config); a resumed run that kept earlier records keeps their
            # record (or none), the older code
            config = str((CONFIGS / f"{name}.toml").relative_to(ctx.root))
            code = ctx.code_version([config]) if earlier is None else earlier[0]
            # with the machine and the date, which a section rendered from the saved results
            # states (not those of the text it replaces)
            saved = {k: v for k, v in json.loads((folder / "results.json").read_text()).items()
                     if k != CODE_KEY}
            saved.update(machine=machine_summary(), date=time.strftime("%Y-%m-%d"))
            if code is not None:
                saved[CODE_KEY] = code
            write_json(folder / "results.json", saved)
            out[f"experiment-{name}"] = {**saved, "records": records}  # wall_seconds: all resumes
        for name in args.configs:  # the check of this run, if it ran, is what they state
            out[f"experiment-{name}"].update(invariance=check,
                                              invariance_config=check_config())
    out[SUMMARY] = _folder(ctx.results_dir)
    return out


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(
        harness.Section(SUMMARY, "", _render_summary, first=True, load=_folder),
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
