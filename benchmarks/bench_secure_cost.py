"""What the secure protocol costs, side by side with the version it replaced.

Three runs over the same clients' statistics (C = 10, d = 512, mode ``pooled``, 200 samples per
client), one after another in one run:

* ``plain``: the statistics in the clear (the floor);
* ``v2``: the default authenticated protocol as it was before complaints stopped carrying keys
  (protocol version 2: five stages, the graph sized for n and seeded by a hash of the relayed
  advertisements), run from the source of git revision ``--baseline-ref`` (extracted with
  ``git archive`` into a temporary folder and imported in a child process);
* ``now``: today's default protocol (version 3: a ``reveal`` stage whose committed nonces seed
  the graph, pair-keyed share boxes with signed key commitments, transcripts bound to the
  session, the graph sized for the worst relayed roster).

Both secure runs use identity keys on one roster and no round ledger (a ledger file per client
is the same small write in both). Clients run one after another, so "client s" adds up every
client's time; per client it is that sum over n. Bytes are message content per client.
Exactness is the relative error of the secure total against the float64 sum of the same
statistics. The machine's load average is recorded beside every run.

Results are kept per (clients, protocol): a run with ``--clients 1000`` replaces the 1,000 rows
and keeps the others, so the grid can be measured in parts.

Writes benchmarks/results/secure_cost.json and the ``secure_cost`` section of BENCHMARKS.md.
Run: ``.venv/bin/python benchmarks/bench_secure_cost.py [--clients 100 1000]
[--baseline-ref REV]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _secure_cost_run import CLIP, C, D, N, reference, run
from ghofl.bench import harness
from ghofl.bench.report import machine_summary, markdown_table

SECTION = "secure_cost"


#: The last revision of protocol version 2 (the baseline of the side-by-side run).
BASELINE_REF = "9c6a676"
#: The file each run's child executes (the baseline's row: with that revision's source).
WORKER = Path(__file__).with_name("_secure_cost_run.py")


def _baseline(ctx: harness.Context, n: int) -> dict[str, Any]:
    """The v2 run: the baseline revision's source in a child process."""
    ref = ctx.args.baseline_ref
    with tempfile.TemporaryDirectory(prefix="ghofl-v2-") as tmp:
        archive = subprocess.run(["git", "-C", str(ctx.root), "archive", ref, "src"],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            raise harness.BenchmarkError(
                f"cannot extract the baseline revision {ref!r} with git archive "
                f"({archive.stderr.decode().strip()}); run from a git clone with its history, "
                "or give --baseline-ref")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        env = {**os.environ, "PYTHONPATH": str(Path(tmp) / "src")}
        child = subprocess.run([sys.executable, str(WORKER), str(n)],
                               env=env, capture_output=True, text=True, check=False)
    if child.returncode != 0:
        raise harness.BenchmarkError(f"the baseline run failed:\n{child.stderr[-2000:]}")
    row: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    row["variant"], row["baseline_ref"] = "v2", ref
    if row["protocol_version"] != 2:
        raise harness.BenchmarkError(
            f"the baseline child imported ghofl from {row['ghofl_source']} (protocol version "
            f"{row['protocol_version']}), not revision {ref}")
    return row


def measure(ctx: harness.Context) -> dict[str, Any]:
    old = ctx.load("secure_cost.json", {}) or {}
    asked = set(ctx.args.clients)
    rows = [r for r in old.get("rows", []) if r["clients"] not in asked
            and r["variant"] in ("plain", "v2", "now") and "load_before" in r]
    for n in ctx.args.clients:
        reference_total = reference(n)
        for variant in ("plain", "v2", "now"):
            ctx.log(f"n = {n}: {variant} ...")
            rows.append(_baseline(ctx, n) if variant == "v2" else run(variant, n, reference_total))
            r = rows[-1]
            ctx.log(f"  wall {r['wall_s']:.1f} s, client {r['client_s']:.1f} s, server "
                    f"{r['server_s']:.1f} s, sent {r['sent_bytes_per_client'] / 1e3:.1f} kB, "
                    f"load {r['load_before']:.2f}")
    rows.sort(key=lambda r: (r["clients"], ("plain", "v2", "now").index(r["variant"])))
    return {SECTION: {"machine": machine_summary(),
                      "date": time.strftime("%Y-%m-%d", time.gmtime()), "rows": rows}}


def render(results: dict[str, Any]) -> str:
    rows = results["rows"]
    lines = [f"Measured {results['date']}. Machine: {results['machine']}. C = {C}, d = {D}, "
             f"mode `pooled`, {N} samples per client, R = {CLIP:g}, 2 limbs; clients run one "
             "after another in one process (client seconds add up; per client is that sum "
             "over n). `v2`: the default authenticated protocol of revision "
             f"{next((r['baseline_ref'] for r in rows if 'baseline_ref' in r), BASELINE_REF)} "
             "(version 2); `now`: version 3 (reveal stage, pair-keyed boxes, session-bound "
             "transcripts, (k, t_s) derived for the relayed roster). Both: threshold "
             "⌊(n + ⌊n/3⌋)/2⌋ + 1, exposure ≤ 2^-40 and abort ≤ 2^-20 at γ = δ = 1/3. Targets: "
             "`now` at 100 clients ≤ 20 s, at 1,000 ≤ 10 min, sent ≤ 2.5× plain. Load: the "
             "1-minute load average when the run started.", ""]
    plain = {r["clients"]: r for r in results["rows"] if r["variant"] == "plain"}
    body = []
    for r in results["rows"]:
        p = plain[r["clients"]]
        params = r["params"] or {}
        body.append([
            f"{r['clients']:,}", r["variant"], params.get("threshold", "–"),
            params.get("neighbours", "–"), f"{r['wall_s']:.2f}", f"{r['server_s']:.2f}",
            f"{r['client_s_per_client']:.3f}", f"{r['sent_bytes_per_client'] / 1e3:,.1f}",
            f"{r['sent_bytes_per_client'] / p['sent_bytes_per_client']:.2f}x",
            f"{r['received_bytes_per_client'] / 1e3:,.1f}", f"{r['rel_error']:.1e}",
            f"{r.get('load_before', float('nan')):.2f}"])
    lines.append(markdown_table(
        ["clients", "protocol", "t", "k", "wall s", "server s", "s per client",
         "sent kB/client", "sent vs plain", "received kB/client", "rel. error vs float64 sum",
         "load"], body))
    lines += ["", _ratios(results["rows"])]
    return "\n".join(lines)


def _ratios(rows: list[dict[str, Any]]) -> str:
    """One line per n: now against v2, side by side in the same run."""
    out = []
    for n in sorted({r["clients"] for r in rows}):
        by = {r["variant"]: r for r in rows if r["clients"] == n}
        if "now" in by and "v2" in by:
            now, v2 = by["now"], by["v2"]

            def ratio(key: str, now: dict[str, Any] = now, v2: dict[str, Any] = v2) -> float:
                return float(now[key]) / float(v2[key])

            out.append(f"- {n:,} clients: now / v2 wall {ratio('wall_s'):.2f}x, sent "
                       f"{ratio('sent_bytes_per_client'):.3f}x, received "
                       f"{ratio('received_bytes_per_client'):.2f}x.")
    return "\n".join(out)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--baseline-ref", default=BASELINE_REF,
                    help="git revision of the protocol-version-2 baseline")


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section(SECTION, "secure_cost.json", render, states_machine=True),),
    measure=measure,
    timings=True,
    add_arguments=add_arguments,
    child_processes=True,
)

if __name__ == "__main__":
    harness.main(BENCH)
