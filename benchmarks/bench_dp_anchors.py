"""ghofl's DP heads beside outside DP anchors, same features, same ε (section ``dp_anchors``).

Features: CIFAR-10 (EfficientNet-Lite0 at 224 px, the features of every other CIFAR-10 table,
all 50,000 train / 10,000 test) and TREC (MiniLM, 5,452 / 500), read through the embedding
cache (:func:`ghofl.bench.features.load_features`; embedded on the first run). At ε ∈ {0.5,
1, 2, 4, 8}, δ = 1e-5, every method sees every row clipped to one public bound R per data set:
``--clip dp`` (the default), the encoder's bound for DP
(:func:`ghofl.client.encoders.dp_clip_norm`, the median public norm), its default bound where
it has none; ``--clip default``, the default bound
(:func:`ghofl.client.encoders.default_clip_norm`, BENCHMARKS.md "Default clipping bounds").
A part measured again at another bound keeps the one it replaces as ``"earlier"`` (shown in
the columns *at R = …*); tables average only the parts at the reference part's bound. The
anchors see the rows scaled by 1/R:

- DP-SGD softmax probe, central, Opacus's RDP accountant (:mod:`ghofl.bench.dp_anchors`):
  *default* (the first grid point, one run at the row's ε), *tuned* (every grid point a run at
  the row's ε, an ε-DP exponential-mechanism choice on a 10 % validation split: the search as
  a whole spends more, stated) and *tuned with search ε* (every run at the per-run ε whose RDP
  composition over the grid spends exactly the row's ε);
- diffprivlib's ε-DP GaussianNB (per-feature bounds that the clipping guarantees,
  :func:`~ghofl.bench.dp_anchors.feature_bounds`) and ε-DP LogisticRegression (objective
  perturbation, δ = 0, data_norm = 1: the norm the scaled rows obey);
- ghofl's heads through the public API (FederationPlan, AggregationSpec(dp=DPConfig(...)),
  ServerJob, simulate with Population(K, α = 0.5)): central noise (a plain sum; the release
  does not depend on K, so it runs at the first K) and distributed noise (secure aggregation,
  each client adds a share) at every K of ``--clients``.

Resumable: one part per (data set, ε, seed), plus one reference part per data set (diffprivlib
at ε = 1e6 beside scikit-learn's non-private GaussianNB and LogisticRegression, and ghofl's
heads without DP), each written to ``benchmarks/results/dp_anchors/`` when it finishes; a
rerun skips the parts that exist (``--fresh`` measures them again) and the section renders from
every part there. Cells: mean ± standard error over the seeds; verdicts by
:mod:`ghofl.bench.decide`.

``--mode-seeds A-B`` runs ghofl only, central and distributed (every K of ``--clients``), for
seeds A to B at every ε of ``--epsilons``: one *modes* part per (data set, ε, block),
``<dataset>-eps<ε>-modes-s<A>-<B>.json`` (:mod:`_dp_modes`), its simulation seeded from (seed,
ε) so that every (seed, ε) draws independent noise. The distributed-vs-central verdicts pool
the ghofl runs of every part, full and modes; the anchor comparisons use the full parts.

Run ``python benchmarks/bench_dp_anchors.py`` (``dp-anchors`` and ``privacy`` extras;
``--datasets``, ``--epsilons``, ``--seeds`` pick a slice of the grid). ``--quick`` (a few
minutes at most): 300 / 200 CIFAR-10 images per class and all of TREC, ε = 2, seed 0, K = 10,
two grid points; prints the section and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from _dp_modes import (
    MODES_TEXT,
    at_reference_clip,
    ghofl_cells,
    heads_table,
    left_out,
    modes_part_name,
    modes_table,
    parse_seed_block,
    reference_clips,
    run_modes,
)
from ghofl.bench import harness
from ghofl.bench.config import config_from_dict
from ghofl.bench.decide import at_or_above, fmt_mean_se, mean_se
from ghofl.bench.dp_anchors import (
    SGDConfig,
    clipped_rows,
    diffprivlib_lr,
    diffprivlib_nb,
    dpsgd_probe,
    feature_bounds,
    per_run_epsilon,
)
from ghofl.bench.features import Features, load_features
from ghofl.bench.provenance import CODE_KEY
from ghofl.bench.report import markdown_table, write_json
from ghofl.client.encoders import (
    DEFAULT_CLIP_NORMS,
    DP_CLIP_NORMS,
    default_clip_norm,
    dp_clip_norm,
    recommended_clip_norm,
)
from ghofl.client.job import ClientJob
from ghofl.privacy import DPConfig
from ghofl.privacy.prior import save_prior, within_covariance
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server.simulation import Population, simulate
from ghofl.stats.projection import pca_basis, save_basis

RESULTS = "dp_anchors"
DELTA = 1e-5
ALPHA = 0.5
RESOLUTION = 224
HEADS = ("lda", "ridge", "ncm", "nb")
#: ε of the anchors' sanity check (diffprivlib's noise is then negligible).
LARGE_EPS = 1e6
LARGE_EPS_TEXT = "1e6"
#: dataset -> (encoder, public per-coordinate range of its embeddings by construction)
DATASETS: dict[str, tuple[str, tuple[float, float]]] = {
    "cifar10": ("efficientnet-lite0", (0.0, 6.0)),  # averages of ReLU6 outputs
    "trec": ("minilm", (-1.0, 1.0)),  # unit vectors
}
#: dataset -> the public data sets whose train features give the basis of the DP subspace
#: (``--subspace auto``: ``DPConfig(subspace="auto:<fingerprint>")``); a data set without one
#: runs ``auto`` with no basis, i.e. in the whole space.
PUBLIC_BASIS: dict[str, tuple[str, ...]] = {"cifar10": ("tiny-imagenet",),
                                             "trec": ("sst2", "agnews")}
#: The method key of a central run in the whole space kept beside a subspace run.
WHOLE = "ghofl/central@whole"
#: The method key of a central run without the public covariance prior kept beside one with it.
NO_PRIOR = "ghofl/central@noprior"
#: Method keys of ghofl's runs at the DP clipping bound (``--dp-clip-runs``), beside the rest.
DP_CLIP = "ghofl/central@dpclip"
DP_CLIP_DISTRIBUTED = "ghofl/distributed/10@dpclip"
DP_CLIP_NODP = "ghofl/nodp@dpclip"
#: Methods of a replaced part clipped at another bound shown beside the new runs
#: (:func:`kept_earlier`), and the keys they take in :func:`_cells`.
EARLIER = ("ghofl/central", "dpsgd_search")
EARLIER_PREFIX = "earlier:"
EARLIER_CLIP = "earlier:clip"
#: Keys of :data:`~ghofl.client.encoders.DP_CLIP_NORMS` whose bounds the section states.
LITE = ("efficientnet-lite0", RESOLUTION)
MINILM = ("all-MiniLM-L6-v2", None)
#: Directions kept in a public basis file (the auto rule uses round(0.4·d) of them).
BASIS_DIRECTIONS = 768
#: dataset -> (train, test) images per class in --quick (0: all)
QUICK_SUBSET = {"cifar10": (300, 200), "trec": (0, 0)}
GRID = (SGDConfig(1.0, 2.0, 10, 1024), SGDConfig(1.0, 8.0, 10, 1024),
        SGDConfig(0.5, 16.0, 20, 2048))
#: (method key, column title) of the anchors, in table order
ANCHORS = (("dpsgd_search", "DP-SGD tuned, search ε"), ("dpsgd", "DP-SGD tuned"),
           ("dpsgd_default", "DP-SGD default"), ("dp_nb", "diffprivlib NB"),
           ("dp_lr", "diffprivlib LR"))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--datasets", default="cifar10,trec")
    ap.add_argument("--epsilons", default="0.5,1,2,4,8")
    ap.add_argument("--clients", default="10,100")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--mode", default="pooled", choices=("pooled", "full"),
                    help="ghofl upload mode")
    ap.add_argument("--projection", type=int, default=0,
                    help="public random projection k (0: none)")
    ap.add_argument("--subspace", default="auto",
                    help="ghofl's DP subspace (DPConfig.subspace); 'auto' names the public "
                    "basis of PUBLIC_BASIS when the data set has one")
    ap.add_argument("--prior", default="auto",
                    help="ghofl's DP prior (DPConfig.prior); 'auto' names the public "
                    "covariance built from PUBLIC_BASIS's labelled train features")
    ap.add_argument("--ghofl-only", action="store_true",
                    help="measure ghofl's runs of the existing full parts again (the anchors "
                    "are kept, with the commit they were measured at as 'anchors_code')")
    ap.add_argument("--dp-clip-runs", action="store_true",
                    help="add to the existing parts ghofl's central and 10-client distributed "
                    "runs (and the reference's run without DP) with the clients clipping at "
                    "the encoder's DP bound (ghofl.client.encoders.dp_clip_norm), keeping "
                    "everything else")
    ap.add_argument("--quick", action="store_true",
                    help="small subsets, ε 2, seed 0, K 10, two grid points; writes nothing")
    ap.add_argument("--fresh", action="store_true", help="measure existing parts again")
    ap.add_argument("--clip", default="dp", choices=("dp", "default"),
                    help="every method's clipping bound: the encoder's bound for DP "
                         "(dp_clip_norm, the default; its default bound where it has none) or "
                         "its default bound (default_clip_norm)")
    ap.add_argument("--mode-seeds", default="",
                    help="'A-B': ghofl central and distributed only, seeds A to B, noise "
                    "seeded from (seed, ε); one modes part per (data set, ε)")


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _features(name: str, data_dir: str | None, quick: bool,
              rule: str = "dp") -> tuple[Features, float]:
    """The data set's features and every method's clipping bound under ``rule`` (``--clip``)."""
    enc = DATASETS[name][0]
    per_train, per_test = QUICK_SUBSET[name] if quick else (0, 0)
    cfg = config_from_dict({"datasets": [name], "resolution": RESOLUTION, "data_dir": data_dir,
                            "train_per_class": per_train, "test_per_class": per_test})
    feats = load_features(name, enc, cfg)
    found = recommended_clip_norm(feats.encoder_info, dp=rule == "dp")
    assert found is not None, f"no default clipping bound for {enc}"
    return feats, found[0]


def _check_same_clip(ds: str, names: list[str], parts: dict[str, Any], clip: float,
                     f: Features) -> None:
    """Refuse ``--ghofl-only`` on parts whose anchors were clipped at another bound than
    ``clip`` (before anything is measured), naming the ``--clip`` that matches them."""
    for name in names:
        old = parts[name].get("clip")
        if old is None or float(old) == clip:
            continue
        info = f.encoder_info
        fix = ("pass --clip default" if old == default_clip_norm(info) else
               "pass --clip dp" if old == dp_clip_norm(info) else "measure them again (--fresh)")
        raise harness.BenchmarkError(
            f"{name} clipped its anchors at R = {old:g}, this --clip gives R = {clip:g}: "
            f"--ghofl-only would mix the two bounds in one part; {fix}")


def kept_earlier(part: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """``part`` with ``old`` (the part it replaces) kept as ``"earlier"`` when ``old`` clipped
    at another bound: its methods and clip, the table's columns *at R = <old clip>*."""
    if old is None or old.get("clip") in (None, part.get("clip")):
        return part if old is None or "earlier" not in old else {**part,
                                                                  "earlier": old["earlier"]}
    return {**part, "earlier": {"clip": old["clip"], "methods": old["methods"],
                                "date": old.get("date"), CODE_KEY: old.get(CODE_KEY)}}


def public_basis(ds: str, data_dir: str | None, log: Any,
                 clip: float | None = None) -> dict[str, str] | None:
    """The public basis and within-class covariance of ``ds``'s encoder (:data:`PUBLIC_BASIS`).

    Built from the labelled train features of the public data sets (the covariance from rows
    clipped at ``clip``, each public data set's classes its own), written to the first folder
    of :func:`ghofl.stats.projection.basis_dirs`; ``{"fingerprint", "source"}`` (the basis),
    plus ``"covariance"`` when ``clip`` is given; None when ``ds`` has no public data set.
    """
    names = PUBLIC_BASIS.get(ds)
    if not names:
        return None
    enc = DATASETS[ds][0]
    feats = [load_features(n, enc, config_from_dict({
        "datasets": [n], "resolution": RESOLUTION, "data_dir": data_dir}), log=log)
        for n in names]
    x = np.concatenate([f.x_train for f in feats])
    t = time.perf_counter()
    source = f"{' + '.join(names)} train ({x.shape[0]} rows)"
    _, fp = save_basis(pca_basis(x, min(BASIS_DIRECTIONS, x.shape[1])),
                       source=f"{' + '.join(names)} train, {x.shape[0]} rows, {enc}")
    log(f"public basis of {ds}: {fp} from {x.shape[0]} rows of {', '.join(names)} "
        f"({time.perf_counter() - t:.1f} s)")
    out = {"fingerprint": fp, "source": source}
    if clip is not None:
        offsets = np.cumsum([0, *(len(f.classes) for f in feats)])
        y = np.concatenate([f.y_train + o for f, o in zip(feats, offsets, strict=False)])
        _, cov = save_prior(within_covariance(x, y, clip), source=f"{source}, clipped at {clip}")
        log(f"public covariance of {ds}: {cov}")
        out["covariance"] = cov
    return out


def subspace_option(option: str, basis: dict[str, str] | None
                    ) -> tuple[str, dict[str, str] | None]:
    """``DPConfig.subspace`` of a run (``auto`` names the data set's public basis, if any),
    and the basis it names (None when it names none)."""
    if option == "auto" and basis:
        return f"auto:{basis['fingerprint']}", basis
    named = basis is not None and option.endswith(basis["fingerprint"])
    return option, basis if named else None


def prior_option(option: str, public: dict[str, str] | None) -> str:
    """``DPConfig.prior`` of a run: ``auto`` names the data set's public covariance, if any."""
    if option == "auto" and public and public.get("covariance"):
        return f"auto:{public['covariance']}"
    return option


#: The post-processing note stating the prior's weight (:mod:`ghofl.privacy.prior`).
_PRIOR = re.compile(r"mixed with the public covariance (?P<fp>[0-9a-f]{16}) \(P3p\): weight "
                    r"b = (?P<b>[0-9.]+)")


def prior_choice(notes: list[str]) -> dict[str, Any] | None:
    """{"fingerprint", "weight"} of the public covariance a release was mixed with, or None."""
    for note in notes:
        m = _PRIOR.search(note)
        if m:
            return {"fingerprint": m["fp"], "weight": float(m["b"])}
    return None


#: The post-processing note stating the subspace (:mod:`ghofl.privacy.subspace`).
_CHOICE = re.compile(r"^fitted in (the first (?P<k>\d+) principal directions|the whole space)")
_RATIO = re.compile(r"rho = (?:sigma_B\*d/\(R\^2\*\(N-C\)\) = )?(?P<rho>[0-9.e+-]+)")
_CAPTURE = re.compile(r"keep(?:ing| only) (?P<c>[0-9.]+) of the (?:release's )?between-class "
                      r"energy(?:(?:, at least | \(at least )(?P<low>[0-9.]+))?")


def subspace_choice(notes: list[str]) -> dict[str, Any] | None:
    """{"k": int or None (whole space), "ratio": ρ, "capture": (c_k, bound) or None, "note"}
    from a release's notes."""
    for note in notes:
        m = _CHOICE.match(note)
        if m:
            r, c = _RATIO.search(note), _CAPTURE.search(note)
            return {"k": int(m["k"]) if m["k"] else None,
                    "ratio": float(r["rho"]) if r else None,
                    "capture": None if c is None else [
                        float(c["c"]), float(c["low"]) if c["low"] else None], "note": note}
    return None


def _ghofl(f: Features, clip: float, upload: tuple[str, int], dp: DPConfig | None,
           clients: int, seed: int, choice: list[dict[str, Any]] | None = None
           ) -> dict[str, float]:
    """ghofl's heads' accuracies; ``choice`` receives the release's subspace choice, with the
    public covariance prior it was mixed with (``"prior"``: None when none)."""
    mode, k = upload
    distributed = dp is not None and dp.mode == "distributed"
    agg = AggregationSpec("secure", dp=dp) if distributed else AggregationSpec("plain", dp=dp)
    plan = FederationPlan(
        ClientJob(tuple(f.classes), mode, projection_dim=k or None, projection_seed=0,  # type: ignore[arg-type]
                  clip_norm=clip), agg, ServerJob(HEADS, seed=seed))
    res = simulate(plan, (f.x_train, f.y_train), (f.x_test, f.y_test),
                   Population(clients, ALPHA))
    if choice is not None and res.privacy is not None:
        notes = list(res.privacy.get("postprocessing", []))
        found = subspace_choice(notes)
        if found is not None:
            choice.append({**found, "prior": prior_choice(notes)})
    return {h: float(r.accuracy) for h, r in res.heads.items()}


def _scaled(f: Features, clip: float) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """Train and test rows clipped to R and scaled by 1/R (unit ball; a public rule)."""
    return ((clipped_rows(f.x_train, clip) / clip, f.y_train),
            (clipped_rows(f.x_test, clip) / clip, f.y_test))


def _timed(seconds: dict[str, float], name: str, fn: Any) -> Any:
    t = time.perf_counter()
    out = fn()
    seconds[name] = time.perf_counter() - t
    return out


def run_ghofl(f: Features, clip: float, eps: float, seed: int, ks: list[int],
              upload: tuple[str, int], subspace: str,
              prior: str = "none") -> tuple[dict[str, Any], dict[str, float]]:
    """ghofl central (at ``ks[0]``) and distributed (every K) at one (data set, ε, seed).

    Returns the methods (each ``{"clients", "heads", "subspace"}``: the subspace the release
    was fitted in, from its notes) and their seconds.
    """
    m: dict[str, Any] = {}
    sec: dict[str, float] = {}
    runs = [("ghofl/central", "central", ks[0]),
            *((f"ghofl/distributed/{k}", "distributed", k) for k in ks)]
    for name, noise, k in runs:
        choice: list[dict[str, Any]] = []
        dp = DPConfig(eps, DELTA, noise, subspace=subspace,  # type: ignore[arg-type]
                      prior=prior)
        heads = _timed(sec, name, lambda dp=dp, k=k, choice=choice: _ghofl(
            f, clip, upload, dp, k, seed, choice))
        m[name] = {"clients": k, "heads": heads, "subspace": choice[0] if choice else None}
    return m, sec


def run_part(f: Features, clip: float, eps: float, seed: int, ks: list[int],
             grid: tuple[SGDConfig, ...], upload: tuple[str, int],
             subspace: str, prior: str = "none") -> dict[str, Any]:
    """Every method at one (data set, ε, seed): the anchors, then ghofl central and distributed."""
    train, test = _scaled(f, clip)
    c, sec = len(f.classes), dict[str, float]()
    bounds = feature_bounds(DATASETS[f.dataset][1], clip)
    m: dict[str, Any] = {}
    m["dpsgd"] = _timed(sec, "dpsgd", lambda: dpsgd_probe(train, test, c, eps, DELTA, grid,
                                                           seed))
    m["dpsgd_default"] = {"accuracy": m["dpsgd"]["default_accuracy"]}

    def search() -> dict[str, Any]:
        n_part = len(train[1]) - max(1, round(0.1 * len(train[1])))
        e_run = per_run_epsilon(grid, n_part, eps, DELTA)
        return dpsgd_probe(train, test, c, eps, DELTA, grid, seed, eps_run=e_run)

    m["dpsgd_search"] = _timed(sec, "dpsgd_search", search)
    m["dp_nb"] = {"accuracy": _timed(sec, "dp_nb", lambda: diffprivlib_nb(
        train, test, eps, bounds, seed)), "bounds": list(bounds)}
    m["dp_lr"] = {"accuracy": _timed(sec, "dp_lr", lambda: diffprivlib_lr(
        train, test, eps, 1.0, seed)), "data_norm": 1.0}
    gm, gsec = run_ghofl(f, clip, eps, seed, ks, upload, subspace, prior)
    m.update(gm)
    sec.update(gsec)
    return {"dataset": f.dataset, "epsilon": eps, "seed": seed, "methods": m, "seconds": sec,
            "subspace": subspace, "prior": prior}


def remeasure_ghofl(part: dict[str, Any], f: Features, clip: float, ks: list[int],
                    upload: tuple[str, int], subspace: str,
                    prior: str = "none") -> dict[str, Any]:
    """``part`` with ghofl's runs measured again; its anchors kept (``anchors_code``).

    When the central release is now fitted in a subspace and the part's earlier central run
    was in the whole space, that run is kept as ``ghofl/central@whole`` (the table's
    whole-space column: what the subspace changed, on the same noise seed). Likewise, when it is
    now mixed with a public covariance and the earlier one was not, that run is kept as
    ``ghofl/central@noprior``.
    """
    gm, gsec = run_ghofl(f, clip, float(part["epsilon"]), int(part["seed"]), ks, upload,
                         subspace, prior)
    methods = {k: v for k, v in part["methods"].items() if not k.startswith("ghofl/")}
    before = part["methods"].get("ghofl/central")
    now = gm["ghofl/central"].get("subspace") or {}
    if (before is not None and now.get("k") is not None
            and (before.get("subspace") or {}).get("k") is None):
        methods[WHOLE] = before
    elif WHOLE in part["methods"] and now.get("k") is not None:
        methods[WHOLE] = part["methods"][WHOLE]
    if before is not None and now.get("prior") and not (before.get("subspace") or {}).get(
            "prior"):
        methods[NO_PRIOR] = before
    elif NO_PRIOR in part["methods"] and now.get("prior"):
        methods[NO_PRIOR] = part["methods"][NO_PRIOR]
    seconds = {k: v for k, v in part["seconds"].items() if not k.startswith("ghofl/")}
    return {**part, "methods": {**methods, **gm}, "seconds": {**seconds, **gsec},
            "subspace": subspace, "prior": prior,
            "anchors_code": part.get("anchors_code", part.get(CODE_KEY))}


def run_reference(f: Features, clip: float, upload: tuple[str, int],
                  ks: list[int]) -> dict[str, Any]:
    """diffprivlib at ε = LARGE_EPS beside scikit-learn's non-private models; ghofl without DP."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import GaussianNB

    train, test = _scaled(f, clip)
    bounds = feature_bounds(DATASETS[f.dataset][1], clip)
    sec: dict[str, float] = {}
    m: dict[str, Any] = {
        "nb": _timed(sec, "nb", lambda: float(GaussianNB().fit(*train).score(*test))),
        "lr": _timed(sec, "lr", lambda: float(LogisticRegression(C=1.0, max_iter=300).fit(
            *train).score(*test))),
        "dp_nb_large": _timed(sec, "dp_nb_large", lambda: diffprivlib_nb(
            train, test, LARGE_EPS, bounds, 0)),
        "dp_lr_large": _timed(sec, "dp_lr_large", lambda: diffprivlib_lr(
            train, test, LARGE_EPS, 1.0, 0)),
        "ghofl/nodp": _timed(sec, "ghofl/nodp", lambda: _ghofl(f, clip, upload, None, ks[0], 0)),
    }
    return {"dataset": f.dataset, "reference": True, "methods": m, "seconds": sec}


def _stamp(part: dict[str, Any], f: Features, clip: float, upload: str,
           grid: tuple[SGDConfig, ...], code: dict[str, Any] | None) -> dict[str, Any]:
    return {**part, "upload": upload, "clip": clip, "n_train": len(f.y_train),
            "n_test": len(f.y_test), "encoder": f.encoder_name, "resolution": RESOLUTION,
            "grid": [vars(g) for g in grid], "machine": harness.machine_summary(),
            "date": time.strftime("%Y-%m-%d"), CODE_KEY: code}


def part_name(dataset: str, eps: float | None, seed: int | None) -> str:
    """File name of a part: ``<dataset>-eps<ε>-seed<s>.json`` or ``<dataset>-reference.json``."""
    return f"{dataset}-reference.json" if eps is None else f"{dataset}-eps{eps:g}-seed{seed}.json"


def load_parts(path: Path) -> dict[str, Any]:
    """Every saved part under ``path`` (the section's results folder), by file name."""
    return {"parts": {p.name: json.loads(p.read_text()) for p in sorted(path.glob("*.json"))}}


def measure_modes(ctx: harness.Context, block: tuple[int, int]) -> dict[str, Any]:
    """The modes parts of ``block`` (``--mode-seeds``) at every data set and ε asked for."""
    args = ctx.args
    upload, tag = (args.mode, args.projection), f"{args.mode}-k{args.projection}"
    ks = [int(k) for k in _floats(args.clients)]
    folder = ctx.results_dir / RESULTS
    parts = load_parts(folder)["parts"]
    for ds in [d for d in args.datasets.split(",") if d]:
        f, clip = _features(ds, ctx.data_dir(required=False), False, args.clip)
        # a part at another bound is measured again: it would be left out of every table
        saved = {e: parts.get(modes_part_name(ds, e, block)) for e in _floats(args.epsilons)}
        todo = [e for e, p in saved.items()
                if args.fresh or p is None or p.get("clip", clip) != clip]
        if not todo:
            continue
        public = public_basis(ds, ctx.data_dir(required=False), ctx.log, clip)
        sub, used = subspace_option(args.subspace, public)
        pri = prior_option(args.prior, public)
        for eps in todo:
            t = time.perf_counter()

            def run(noise: Any, k: int, seed: int, eps: float = eps, f: Features = f,
                    clip: float = clip, sub: str = sub, pri: str = pri) -> dict[str, float]:
                return _ghofl(f, clip, upload, DPConfig(eps, DELTA, noise, subspace=sub,
                                                        prior=pri), k, seed)

            part = _stamp({**run_modes(run, ds, eps, block, ks, ctx.log), "subspace": sub,
                           "prior": pri, "public_basis": used or public}, f, clip, tag, (),
                          ctx.code_version())
            name = modes_part_name(ds, eps, block)
            parts[name] = part
            ctx.log(f"{name}: {time.perf_counter() - t:.0f} s")
            if not args.no_write:
                write_json(folder / name, part)
    return {RESULTS: {"parts": parts}}


def measure_dp_clip(ctx: harness.Context) -> dict[str, Any]:
    """``--dp-clip-runs``: ghofl at the DP clipping bound added to every existing part.

    Central and 10 clients distributed at each full part's (ε, seed), without DP in the
    reference part, at R = :func:`~ghofl.client.encoders.dp_clip_norm`; the part's other runs
    are kept. A data set whose encoder has no DP bound, or whose DP bound is its bound, is
    skipped.
    """
    args = ctx.args
    upload = (args.mode, args.projection)
    folder = ctx.results_dir / RESULTS
    parts = load_parts(folder)["parts"]
    data_dir = ctx.data_dir(required=False)
    for ds in [d for d in args.datasets.split(",") if d]:
        names = sorted(n for n, p in parts.items() if p.get("dataset") == ds
                       and not p.get("modes") and (args.fresh or not _has_dp_clip(p)))
        names = [n for n in names if parts[n].get("reference")
                 or float(parts[n]["epsilon"]) in _floats(args.epsilons)]
        if not names:
            continue
        f, clip = _features(ds, data_dir, False, "default")
        bound = dp_clip_norm(f.encoder_info)
        if bound is None or bound == clip:
            ctx.log(f"{ds}: the DP bound is {bound} (the bound {clip}): nothing to add")
            continue
        # a part measured at the DP bound already (--clip dp) has nothing to add
        names = [n for n in names if parts[n].get("clip") != bound]
        if not names:
            continue
        public = public_basis(ds, data_dir, ctx.log, bound)
        sub, _ = subspace_option(args.subspace, public)
        pri = prior_option(args.prior, public)
        for name in names:
            t = time.perf_counter()
            part = dict(parts[name])
            methods = dict(part["methods"])
            if part.get("reference"):
                methods[DP_CLIP_NODP] = {"heads": _ghofl(f, bound, upload, None, 10, 0),
                                         "clip": bound}
            else:
                eps, seed = float(part["epsilon"]), int(part["seed"])
                for key, noise, k in ((DP_CLIP, "central", 10),
                                      (DP_CLIP_DISTRIBUTED, "distributed", 10)):
                    choice: list[dict[str, Any]] = []
                    dp = DPConfig(eps, DELTA, noise, subspace=sub,  # type: ignore[arg-type]
                                  prior=pri)
                    methods[key] = {"clients": k, "clip": bound, "heads": _ghofl(
                        f, bound, upload, dp, k, seed, choice),
                        "subspace": choice[0] if choice else None}
            part.update(methods=methods, dp_clip={"clip": bound, "prior": pri,
                                                  "subspace": sub,
                                                  "date": time.strftime("%Y-%m-%d"),
                                                  CODE_KEY: ctx.code_version()})
            parts[name] = part
            ctx.log(f"{name}: DP clip runs {time.perf_counter() - t:.0f} s")
            if not args.no_write:
                write_json(folder / name, part)
    return {RESULTS: {"parts": parts}}


def _has_dp_clip(part: dict[str, Any]) -> bool:
    keys = (DP_CLIP_NODP,) if part.get("reference") else (DP_CLIP, DP_CLIP_DISTRIBUTED)
    return all(k in part.get("methods", {}) for k in keys)


def measure(ctx: harness.Context) -> dict[str, Any] | None:
    args = ctx.args
    quick = bool(args.quick)
    if args.mode_seeds:
        if quick:
            raise harness.BenchmarkError(
                "--quick and --mode-seeds do not combine: --quick measures one full part and "
                "writes nothing; drop one of them")
        return measure_modes(ctx, parse_seed_block(args.mode_seeds))
    if args.dp_clip_runs:
        return measure_dp_clip(ctx)
    upload, tag = (args.mode, args.projection), f"{args.mode}-k{args.projection}"
    grid = GRID[:2] if quick else GRID
    eps_list = [2.0] if quick else _floats(args.epsilons)
    seeds = [0] if quick else [int(s) for s in _floats(args.seeds)]
    ks = [10] if quick else [int(k) for k in _floats(args.clients)]
    folder = ctx.results_dir / RESULTS
    parts = {} if quick else load_parts(folder)["parts"]
    data_dir = ctx.data_dir(required=False)
    write = not (quick or args.no_write)
    for ds in [d for d in args.datasets.split(",") if d]:
        todo = [(None, None), *((e, s) for e in eps_list for s in seeds)]
        if args.ghofl_only:
            todo = [(e, s) for e, s in todo if e is not None and part_name(ds, e, s) in parts]
        else:
            todo = [(e, s) for e, s in todo if args.fresh or part_name(ds, e, s) not in parts]
        if not todo:
            continue
        f, clip = _features(ds, data_dir, quick, args.clip)
        if args.ghofl_only:
            _check_same_clip(ds, [part_name(ds, e, s) for e, s in todo], parts, clip, f)
        public = None if quick else public_basis(ds, data_dir, ctx.log, clip)
        sub, used = subspace_option(args.subspace, public)
        pri = prior_option(args.prior, public)
        for eps, seed in todo:
            t = time.perf_counter()
            if args.ghofl_only:
                old = parts[part_name(ds, eps, seed)]
                part = remeasure_ghofl(old, f, clip, ks, upload, sub, pri)
                part = {**_stamp(part, f, clip, tag, grid, ctx.code_version()),
                        "date": old.get("date"), "ghofl_date": time.strftime("%Y-%m-%d"),
                        "public_basis": used or public}
            else:
                part = (run_reference(f, clip, upload, ks) if eps is None
                        else {**run_part(f, clip, eps, seed or 0, ks, grid, upload, sub, pri),
                              "public_basis": used or public})
                part = kept_earlier(_stamp(part, f, clip, tag, grid, ctx.code_version()),
                                    parts.get(part_name(ds, eps, seed)))
            name = part_name(ds, eps, seed)
            parts[name] = part
            ctx.log(f"{name}: {time.perf_counter() - t:.0f} s "
                    f"{ {k: round(v) for k, v in part['seconds'].items()} }")
            if write:
                write_json(folder / name, part)
    if quick:
        print(render({"parts": parts, "quick": True}))
        return None
    return {RESULTS: {"parts": parts}}


# ---------------------------------------------------------------- rendering


def _cells(parts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(dataset -> ε -> method -> per-seed values, dataset -> reference part).

    A ghofl method's values are per head: ``{"ghofl/central": {"lda": [...], ...}}``.
    """
    cells: dict[str, Any] = {}
    refs: dict[str, Any] = {}
    clips = reference_clips(parts)
    for p in parts.values():
        if p.get("reference"):
            refs[p["dataset"]] = p
            continue
        if p.get("modes"):  # ghofl-only: pooled by _dp_modes.ghofl_cells, not here
            continue
        if not at_reference_clip(p, clips):  # another bound: not averaged in (left_out)
            continue
        at = cells.setdefault(p["dataset"], {}).setdefault(float(p["epsilon"]), {})
        earlier = p.get("earlier")
        if earlier:  # the part this one replaced, clipped at another bound (kept_earlier)
            at.setdefault(EARLIER_CLIP, set()).add(float(earlier["clip"]))
            for name in EARLIER:
                res = earlier["methods"].get(name)
                if res is None:
                    continue
                key = f"{EARLIER_PREFIX}{name}"
                if "heads" in res:
                    for h, acc in res["heads"].items():
                        at.setdefault(key, {}).setdefault(h, []).append(acc)
                else:
                    at.setdefault(key, []).append(res["accuracy"])
        for name, res in p["methods"].items():
            if name == "ghofl/central":  # parts before the DP subspace: the whole space
                at.setdefault("ghofl/central/subspace", []).append(res.get("subspace"))
            if "heads" in res:
                per = at.setdefault(name, {})
                for h, acc in res["heads"].items():
                    per.setdefault(h, []).append(acc)
            else:
                at.setdefault(name, []).append(res["accuracy"])
                if name.startswith("dpsgd") and "eps_search" in res:
                    at.setdefault(f"{name}/eps_search", []).append(res["eps_search"])
    return cells, refs


def _best_head(per: dict[str, list[float]]) -> str:
    return max(per, key=lambda h: mean_se(per[h])[0])


def subspace_cell(choices: list[dict[str, Any] | None]) -> str:
    """The central release's subspace over the seeds: ``k = 512 (ρ 0.31)``, ``whole (ρ …)``."""
    if not choices:
        return "–"
    # read from each note again: parts written before a field existed have the note only
    choices = [subspace_choice([c["note"]]) or c if c and c.get("note") else c
               for c in choices]
    ks = sorted({c["k"] if c else None for c in choices}, key=lambda k: (k is not None, k or 0))
    where = ", ".join("whole" if k is None else f"k = {k}" for k in ks)
    ratios = [c["ratio"] for c in choices if c and c.get("ratio") is not None]
    if len(ratios) < len(choices):
        return where if ratios else f"{where} (no rule recorded)"
    caps = [c["capture"] for c in choices if c and c.get("capture")]
    lows = [c[1] for c in caps if c[1] is not None]
    kept = "" if len(caps) < len(choices) else (
        f"; basis keeps {float(np.mean([c[0] for c in caps])):.2f}"
        + (f", bound {float(np.mean(lows)):.2f}" if len(lows) == len(caps) else ""))
    return f"{where} (ρ {float(np.mean(ratios)):.2g}{kept})"


def prior_cell(choices: list[dict[str, Any] | None]) -> str:
    """The public covariance prior's weight over the seeds: ``b 0.48``, ``none``."""
    if not choices:
        return "–"
    recorded = [c for c in choices if c and "prior" in c]
    if len(recorded) < len(choices):
        return "none (no prior recorded)"
    weights = [c["prior"]["weight"] for c in recorded if c["prior"]]
    if not weights:
        return "none"
    mixed = "" if len(weights) == len(choices) else f" ({len(weights)} of {len(choices)} seeds)"
    return f"b {float(np.mean(weights)):.2f}{mixed}"


def _kept(m: dict[str, Any], key: str) -> str:
    w = m.get(key)
    return "–" if not w else f"{fmt_mean_se(w[_best_head(w)])} ({_best_head(w)})"


def _anchor_table(cells: dict[float, Any]) -> str:
    whole = any(WHOLE in m for m in cells.values())
    noprior = any(NO_PRIOR in m for m in cells.values())
    dpclip = any(DP_CLIP in m for m in cells.values())
    clips = sorted(set().union(*(m.get(EARLIER_CLIP, set()) for m in cells.values())))
    # one column per table: parts replaced from several bounds would average them
    assert len(clips) <= 1, f"parts replaced from several bounds {clips}: measure them again"
    at_r = f"at R = {', '.join(f'{c:g}' for c in clips)} (same seeds)"
    header = ["ε", "seeds", *(t for _, t in ANCHORS), "tuned: search spends ε",
              "ghofl central (best head)", "ghofl subspace", "ghofl prior",
              *(["ghofl central, whole space (same seeds)"] if whole else []),
              *(["ghofl central, no prior (same seeds)"] if noprior else []),
              *(["ghofl central at the DP clip (same seeds)",
                 "distributed/10 at the DP clip"] if dpclip else []),
              *([f"ghofl central {at_r}", f"DP-SGD tuned, search ε, {at_r}"] if clips else [])]
    body = []
    for eps, m in sorted(cells.items()):
        row: list[Any] = [f"{eps:g}", len(m.get("dpsgd", []))]
        row += [fmt_mean_se(m[k]) if k in m else "–" for k, _ in ANCHORS]
        spent = m.get("dpsgd/eps_search")
        row.append(f"{max(spent):.2f}" if spent else "–")
        central = m.get("ghofl/central")
        row.append("–" if not central else
                   f"{fmt_mean_se(central[_best_head(central)])} ({_best_head(central)})")
        row.append(subspace_cell(m.get("ghofl/central/subspace", [])))
        row.append(prior_cell(m.get("ghofl/central/subspace", [])))
        row += [_kept(m, WHOLE)] if whole else []
        row += [_kept(m, NO_PRIOR)] if noprior else []
        row += [_kept(m, DP_CLIP), _kept(m, DP_CLIP_DISTRIBUTED)] if dpclip else []
        if clips:
            search = m.get(f"{EARLIER_PREFIX}dpsgd_search")
            seeds = len(search or [])
            part_of = "" if seeds in (0, len(m.get("dpsgd", []))) else f" ({seeds} seeds)"
            row += [_kept(m, f"{EARLIER_PREFIX}ghofl/central") + part_of,
                    (fmt_mean_se(search) if search else "–") + part_of]
        body.append(row)
    return markdown_table(header, body)


def _verdicts(ds: str, cells: dict[float, Any], ref: dict[str, Any] | None) -> list[str]:
    lines = []
    refs = {} if ref is None else ref["methods"]
    for eps, m in sorted(cells.items()):
        for key, nodp_key, what in (
                ("ghofl/central", "ghofl/nodp", "best ghofl central head"),
                (DP_CLIP, DP_CLIP_NODP, "at the DP clip, best ghofl central head")):
            central = m.get(key)
            if not central:
                continue
            best = _best_head(central)
            c = central[best]
            parts = []
            for anchor, label in ANCHORS:
                if anchor in m and anchor != "dpsgd":
                    parts.append(f"vs {label} " + at_or_above(c, m[anchor]).describe(
                        "at or above", "BELOW"))
            nodp = refs.get(nodp_key, {})
            nodp = nodp.get("heads", nodp)  # the DP-clip reference run keeps its bound too
            if eps == 8.0 and best in nodp:
                parts.append(f"vs {best} without DP ({100 * nodp[best]:.1f}) " + at_or_above(
                    c, [nodp[best]], margin=2.0, b_exact=True).describe("within 2",
                                                                        "NOT within 2"))
            lines.append(f"- {ds}, ε = {eps:g}: {what} {best} ({fmt_mean_se(c)} %): "
                         + "; ".join(parts) + ".")
    return lines


def _reference_line(ds: str, ref: dict[str, Any] | None) -> str:
    if ref is None:
        return f"- {ds}: no reference part yet."
    m = ref["methods"]
    nodp = ", ".join(f"{h} {100 * v:.1f}" for h, v in sorted(m["ghofl/nodp"].items()))
    earlier = ref.get("earlier")
    if earlier and "ghofl/nodp" in earlier["methods"]:
        nodp += f" (at R = {earlier['clip']:g}: " + ", ".join(
            f"{h} {100 * v:.1f}" for h, v in sorted(earlier["methods"]["ghofl/nodp"].items())
        ) + ")"
    return (f"- {ds} (reference): diffprivlib at ε = {LARGE_EPS_TEXT}: GaussianNB "
            f"{100 * m['dp_nb_large']:.1f} (scikit-learn's non-private GaussianNB "
            f"{100 * m['nb']:.1f}), LogisticRegression {100 * m['dp_lr_large']:.1f} "
            f"(non-private, C = 1: {100 * m['lr']:.1f}); ghofl without DP"
            + ("" if ref.get("clip") is None else f" at R = {ref['clip']:g}") + f": {nodp}"
            + ("" if DP_CLIP_NODP not in m else
               f"; at the DP clip R = {m[DP_CLIP_NODP]['clip']:g}: " + ", ".join(
                   f"{h} {100 * v:.1f}" for h, v in sorted(m[DP_CLIP_NODP]["heads"].items())))
            + ".")


def render(data: dict[str, Any]) -> str:
    parts = data.get("parts", {})
    cells, refs = _cells(parts)
    pooled = ghofl_cells(parts)
    blocks = []
    outside = left_out(parts)
    for ds in sorted(set(cells) | set(refs) | set(pooled)):
        dcells, gcells = cells.get(ds, {}), pooled.get(ds, {})
        modes = modes_table(gcells) if gcells else ("", "")
        blocks.append("\n\n".join(b for b in [
            f"**{ds}**", _reference_line(ds, refs.get(ds)),
            _anchor_table(dcells) if dcells else "(no full ε part yet)",
            "\n".join(_verdicts(ds, dcells, refs.get(ds))),
            (f"{outside[ds]} parts of {ds} clipped at another bound than its "
             "reference part are left out of its tables." if outside.get(ds) else ""),
            heads_table(gcells) if gcells else "", *modes] if b).rstrip())
    return _text(data, parts, blocks)


def _bases_text(parts: dict[str, Any]) -> str:
    """The public basis of each data set, as the parts recorded it."""
    seen: dict[str, str] = {}
    for p in parts.values():
        b = p.get("public_basis")
        if b and (b.get("covariance") or p["dataset"] not in seen):
            cov = f", covariance `{b['covariance']}`" if b.get("covariance") else ""
            seen[p["dataset"]] = (f"{p['dataset']}: basis `{b['fingerprint']}`{cov} from "
                                  f"{b['source']}")
    none = sorted({p["dataset"] for p in parts.values()} - set(seen))
    return "; ".join([*(seen[d] for d in sorted(seen)),
                      *(f"{d}: none (the rule then keeps the whole space)" for d in none)])


def _text(data: dict[str, Any], parts: dict[str, Any], blocks: list[str]) -> str:
    first: dict[str, Any] = next((p for p in parts.values() if p.get("grid")), {})
    # every machine the parts were measured on (sorted: the same text from any part order)
    machines = sorted({str(p["machine"]) for p in parts.values() if p.get("machine")})
    grid = ", ".join(f"(clip {g['clip']:g}, lr {g['lr']:g}, {g['epochs']} ep, batch "
                     f"{g['batch']})" for g in first.get("grid", [vars(g) for g in GRID]))
    uploads = sorted({p.get("upload", "?") for p in parts.values()})
    dates = sorted({p.get("date", "?") for p in parts.values()})
    total = sum(sum(p.get("seconds", {}).values()) for p in parts.values())
    n_modes = sum(1 for p in parts.values() if p.get("modes"))
    again = sorted({str(p.get("ghofl_date")) for p in parts.values() if p.get("anchors_code")})
    n_again = sum(1 for p in parts.values() if p.get("anchors_code"))
    slowest = max((sum(p.get("seconds", {}).values()) for p in parts.values()), default=0.0)
    return "\n".join([
        "## Differential privacy beside outside anchors (`benchmarks/bench_dp_anchors.py`)",
        "",
        f"Same features for every method: CIFAR-10 (EfficientNet-Lite0 @{RESOLUTION} px, all "
        "50,000 train / 10,000 test) and TREC (MiniLM, 5,452 / 500), every method's rows "
        "clipped to one bound R per data set (`--clip dp`, the default: the encoder's bound "
        "for DP, `ghofl.client.encoders.dp_clip_norm`, the median embedding norm of public "
        f"data, R = {DP_CLIP_NORMS[LITE]['none']:g} for EfficientNet-Lite0 at 224 px; MiniLM's "
        f"unit vectors keep their default {DP_CLIP_NORMS[MINILM]['none']:g}; `--clip default`: "
        "the default bounds of \"Default clipping bounds\", R = "
        f"{DEFAULT_CLIP_NORMS[LITE]['none']:g} for EfficientNet-Lite0), stated per data set on "
        "its reference line; δ = 1e-5. "
        + ("Columns *at R = … (same seeds)*: the runs these parts replaced, clipped at that "
           "bound, on the same noise seeds. " if any(p.get("earlier") for p in parts.values())
           else "") +
        "Test accuracy (%), "
        "mean ± standard error over the seeds. Anchors train centrally on the clipped rows "
        "scaled by 1/R. **DP-SGD** softmax probe, Opacus's RDP accountant (orders up to "
        f"1024), grid {grid}; *default*: the first grid point, one run at (ε, δ); *tuned*: "
        "every grid point one run at (ε, δ) on 90 % of the training rows, chosen by an ε-DP "
        "exponential mechanism on the other 10 %, so the search spends more than ε (column "
        "*search spends*, the largest over the seeds); *tuned, search ε*: the runs' per-run "
        "ε lowered until their RDP composition spends exactly ε, the choice ε-DP on the "
        "disjoint validation rows: the whole search is (ε, δ)-DP. **diffprivlib** "
        "GaussianNB (ε-DP, δ = 0; per-feature bounds that the clipping guarantees, "
        "[min(lo, 0), max(hi, 0)] ∩ [−R, R] of the encoder's range, divided by R; ε/3 on the "
        "counts and ε/(3d) on each feature's mean and variance) and LogisticRegression (ε-DP "
        "objective perturbation, C = 1, data_norm = 1, ε/C per one-vs-rest class): configured "
        "as its documentation asks; the reference line checks both reach their non-private "
        f"accuracy at ε = {LARGE_EPS_TEXT}, so their accuracy at ε ≤ 8 is the cost of their "
        f"mechanisms at this d. **ghofl** heads {', '.join(HEADS)} (upload "
        f"{', '.join(f'`{u}`' for u in uploads)}, clip R), Dirichlet α = {ALPHA} clients, "
        "FederationPlan / AggregationSpec(dp=DPConfig) / simulate: *central* = plain sum, the "
        "server noises the total; *distributed* = secure aggregation, each client adds a "
        "share. The budget is split over the blocks these heads read (nb adds the per-class "
        "squared sums, which the others do not read), so each row is that head fitted beside "
        "the others on one release, not alone with the whole budget. The server fits the "
        "release in a public subspace at its default rule (`DPConfig(subspace=\"auto\")`, "
        "post-processing: no budget; docs/privacy.md): the noisy total projected onto the "
        "first round(0.4·d) principal directions of a public basis when the noise ratio "
        "ρ = σ_B·d/(R²·(N − C)) exceeds 0.12 and they keep 0.9 of the release's between-class "
        "energy, else the whole space (column *ghofl subspace*, ρ the mean over the seeds). "
        "It then mixes the denoised pooled covariance with a public within-class covariance "
        "(`DPConfig(prior=\"auto\")`, post-processing), P̂ = (1 − b)·R + b·s·T at the b that "
        "minimises an estimate of the Frobenius error (column *ghofl prior*, b the mean over "
        "the seeds; the earlier runs without it, on the same noise seeds, in the column *no "
        f"prior*). Public bases and covariances: {_bases_text(parts)}. "
        + ("Columns *at the DP clip* (`--dp-clip-runs`, parts measured at `--clip default`): "
           "ghofl's central and 10-client distributed runs again at the DP bound, on the same "
           "noise seeds; the anchors keep their rows. " if any(
               DP_CLIP in p.get("methods", {}) for p in parts.values()) else "") +
        "Verdicts (`ghofl.bench.decide`): *at or above* when the mean difference is "
        "≥ −2 standard errors of the difference; *within t* when |difference| ≤ max(t, 2 "
        "standard errors); fewer than 2 seeds: undecided. " + MODES_TEXT,
        "",
        *(b + "\n" for b in blocks),
        f"Machine: {'; '.join(machines) or '–'}. Measured {', '.join(dates)}"
        f"{' (--quick)' if data.get('quick') else ''}: {len(parts)} parts"
        f"{f' ({n_modes} of them ghofl-only modes parts)' if n_modes else ''}, "
        f"{total / 60:.0f} min in all, the slowest part {slowest / 60:.1f} min."
        + (f" ghofl's runs of {n_again} full parts measured again (`--ghofl-only`, "
           f"{', '.join(again)}); "
           "their anchors are from the earlier run, whose commit each part keeps as "
           "`anchors_code` (the anchors' code is unchanged)." if n_again else ""),
    ])


BENCH = harness.Benchmark(
    script=__file__,
    description=__doc__ or "",
    sections=(harness.Section("dp_anchors", RESULTS, render, load=load_parts),),
    measure=measure,
    add_arguments=add_arguments,
)

if __name__ == "__main__":
    harness.main(BENCH)
