"""ghofl-only "modes" parts of ``bench_dp_anchors.py``: central vs distributed noise, many seeds.

A modes part holds ghofl's central and distributed runs (no outside anchor) for one block of
seeds at one (data set, ε), ``<dataset>-eps<ε>-modes-s<first>-<last>.json``. Its ghofl
simulation is seeded with :func:`mode_seed` of (seed, ε), so every (seed, ε) draws its own noise
(and its own partition); in a full part the simulation is seeded with the seed alone, so one
seed's noise direction is shared by every ε. The distributed-vs-central verdict pools the
ghofl runs of the full parts and of the modes parts (:func:`ghofl_cells`, :func:`modes_table`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ghofl.bench.decide import fmt_mean_se, within
from ghofl.bench.harness import BenchmarkError
from ghofl.bench.report import markdown_table

#: The allowed distance of distributed from central, in points (the issue's bar).
TOL = 0.5
_BLOCK = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")
MODES_TEXT = (
    "In a full part ghofl's simulation is seeded with the part's seed alone, so one seed's "
    "noise direction is the same at every ε (only its scale changes): the ε rows of the full "
    "parts are not independent evidence. The *modes* parts (`--mode-seeds A-B`: ghofl central "
    "and distributed only, at every K) seed it with "
    "`SeedSequence([seed, round(1000 ε)]).generate_state(1)[0]`, an independent noise draw (and "
    "partition) per (seed, ε). The ghofl tables and the distributed-vs-central verdicts pool "
    "every ghofl run, full and modes parts (their seed counts stated), at the data set's "
    "clipping bound (that of its reference part: a part at another bound is left out, and "
    "counted); the comparisons with the outside anchors use the full parts only. "
    "Distributed vs central: "
    f"`within(distributed, central, {TOL:g})` per (ε, K, head), unpaired.")


def parse_seed_block(text: str) -> tuple[int, int]:
    """The block ``"A-B"`` of ``--mode-seeds`` as (A, B), 0 <= A <= B, both inclusive.

    Raises
    ------
    BenchmarkError
        ``text`` is not two non-negative integers ``A-B`` with A <= B.
    """
    m = _BLOCK.fullmatch(text)
    if m is None or int(m.group(1)) > int(m.group(2)):
        raise BenchmarkError(
            f"--mode-seeds takes a block of seeds 'A-B' with 0 <= A <= B (both included), "
            f"e.g. '5-24'; got {text!r}")
    return int(m.group(1)), int(m.group(2))


def mode_seed(seed: int, eps: float) -> int:
    """The seed of ghofl's simulation in a modes part: a function of (seed, ε), in [0, 2³²)."""
    return int(np.random.SeedSequence([seed, round(1000 * eps)]).generate_state(1)[0])


def modes_part_name(dataset: str, eps: float, block: tuple[int, int]) -> str:
    """File name of a modes part: ``<dataset>-eps<ε>-modes-s<first>-<last>.json``."""
    return f"{dataset}-eps{eps:g}-modes-s{block[0]}-{block[1]}.json"


def run_modes(run: Callable[[str, int, int], dict[str, float]], dataset: str, eps: float,
              block: tuple[int, int], ks: list[int],
              log: Callable[[str], None]) -> dict[str, Any]:
    """ghofl central (at ``ks[0]``) and distributed (at every K) for every seed of ``block``.

    Parameters
    ----------
    run : callable
        ``run(noise, clients, server_seed)`` -> {head: accuracy}: one ghofl simulation at this
        (data set, ε), ``noise`` ``"central"`` or ``"distributed"``.
    dataset, eps, block, ks :
        The part's data set, ε, seeds (A, B inclusive) and client counts.
    log : callable
        Progress, one line a seed.

    Returns
    -------
    dict
        The part: ``runs[str(seed)][method] = {"clients", "server_seed", "heads"}`` with methods
        ``ghofl/central`` and ``ghofl/distributed/<K>``, and seconds per method (summed).
    """
    runs: dict[str, Any] = {}
    sec: dict[str, float] = {}
    todo = [("ghofl/central", "central", ks[0]),
            *((f"ghofl/distributed/{k}", "distributed", k) for k in ks)]
    for seed in range(block[0], block[1] + 1):
        server_seed = mode_seed(seed, eps)
        per: dict[str, Any] = {}
        for name, noise, k in todo:
            t = time.perf_counter()
            per[name] = {"clients": k, "server_seed": server_seed,
                         "heads": run(noise, k, server_seed)}
            sec[name] = sec.get(name, 0.0) + time.perf_counter() - t
        runs[str(seed)] = per
        log(f"{dataset} ε={eps:g} seed {seed} (server seed {server_seed}): "
            f"{ {n: round(100 * max(v['heads'].values()), 1) for n, v in per.items()} }")
    return {"dataset": dataset, "epsilon": eps, "modes": True, "seeds": list(block),
            "clients": ks, "runs": runs, "seconds": sec}


def reference_clips(parts: dict[str, Any]) -> dict[str, float]:
    """dataset -> the clipping bound of its reference part (data sets without one left out)."""
    return {p["dataset"]: float(p["clip"]) for p in parts.values()
            if p.get("reference") and p.get("clip") is not None}


def at_reference_clip(part: dict[str, Any], clips: dict[str, float]) -> bool:
    """Whether ``part`` is clipped at its data set's reference bound (:func:`reference_clips`).

    True when either bound is not recorded.
    """
    ref, clip = clips.get(part["dataset"]), part.get("clip")
    return ref is None or clip is None or float(clip) == ref


def left_out(parts: dict[str, Any]) -> dict[str, int]:
    """dataset -> how many of its parts are clipped at another bound than its reference."""
    clips = reference_clips(parts)
    out: dict[str, int] = {}
    for p in parts.values():
        if not at_reference_clip(p, clips):
            out[p["dataset"]] = out.get(p["dataset"], 0) + 1
    return out


def ghofl_cells(parts: dict[str, Any]) -> dict[str, Any]:
    """dataset -> ε -> ghofl method -> head -> per-run accuracies, full and modes parts pooled.

    A modes run is keyed by (seed, clients): a modes seed repeated in two parts at the same K
    counts once, whatever order the parts load in, while central runs of one seed made in
    blocks at different K (``ks[0]``: the simulation also draws the partition, so the noise
    differs) are distinct runs. A full part's seed s and a modes part's seed s are different
    runs (different simulation seeds). A part clipped at another bound (``"clip"``) than the
    data set's reference part is left out.
    """
    keyed: dict[str, Any] = {}
    clips = reference_clips(parts)
    for p in parts.values():
        if p.get("reference") or not at_reference_clip(p, clips):
            continue
        if p.get("modes"):
            runs = {s: m for s, m in p["runs"].items()}
        else:
            # the runs as measured now (a kept earlier run, "ghofl/central@whole", is not)
            runs = {str(p["seed"]): {k: v for k, v in p["methods"].items()
                                     if k.startswith("ghofl/") and "@" not in k}}
        at = keyed.setdefault(p["dataset"], {}).setdefault(float(p["epsilon"]), {})
        for seed, methods in runs.items():
            for name, res in methods.items():
                key = (("modes", int(seed), int(res["clients"])) if p.get("modes")
                       else ("full", int(seed), 0))
                for h, acc in res["heads"].items():
                    at.setdefault(name, {}).setdefault(h, {})[key] = acc
    return {ds: {e: {n: {h: [v[k] for k in sorted(v)] for h, v in per.items()}
                     for n, per in at.items()} for e, at in by.items()}
            for ds, by in keyed.items()}


def _seeds(per: dict[str, list[float]]) -> int:
    return max((len(v) for v in per.values()), default=0)


def heads_table(cells: dict[float, Any]) -> str:
    """ε, noise (K), seeds and mean ± se of every head, over every ghofl run."""
    heads = sorted({h for m in cells.values() for v in m.values() for h in v})
    body = []
    for eps, m in sorted(cells.items()):
        for name in sorted(m, key=lambda k: (k != "ghofl/central", len(k), k)):
            body.append([f"{eps:g}", name[6:], _seeds(m[name]),
                         *(fmt_mean_se(m[name][h]) if h in m[name] else "–" for h in heads)])
    return markdown_table(["ε", "ghofl noise (K)", "seeds", *heads], body)


def modes_table(cells: dict[float, Any]) -> tuple[str, str]:
    """(table, summary line) of distributed vs central per (ε, K, head), over every ghofl run."""
    heads = sorted({h for m in cells.values() for v in m.values() for h in v})
    body, passed, decided = [], 0, 0
    for eps, m in sorted(cells.items()):
        central = m.get("ghofl/central")
        if not central:
            continue
        for name in sorted((k for k in m if k.startswith("ghofl/distributed/")),
                           key=lambda k: int(k.rsplit("/", 1)[1])):
            row: list[Any] = [f"{eps:g}", name.rsplit("/", 1)[1],
                              f"{_seeds(central)} / {_seeds(m[name])}"]
            for h in heads:
                if h not in m[name] or h not in central:
                    row.append("–")
                    continue
                c = within(m[name][h], central[h], TOL)
                decided += c.passed is not None
                passed += bool(c.passed)
                row.append(c.describe(f"within {TOL:g}", f"NOT within {TOL:g}"))
            body.append(row)
    table = markdown_table(["ε", "K", "seeds (central / distributed)",
                            *(f"{h}: distributed − central" for h in heads)], body)
    return table, (f"Distributed within {TOL:g} point of central (or within 2 standard "
                   f"errors where those are larger): {passed} of {decided} decided "
                   "(ε, K, head) cells.")
