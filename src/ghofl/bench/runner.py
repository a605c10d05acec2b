"""Experiment runner: config grid -> tidy records, ``results.json``, ``results.md`` and plots.

One record per (dataset, encoder, mode, projection, alpha, clients, seed, holdout, transport
dtype, head) with accuracy, upload bytes per client and server seconds per stage; reference rows
(centralised probes on the same features) carry ``alpha = clients = seed = None``. Results
are written after every federation, so an interrupted run keeps what it finished and
``resume=True`` continues it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ghofl.bench.config import ExperimentConfig
from ghofl.bench.features import Features, load_features
from ghofl.bench.references import run_reference
from ghofl.bench.report import write_json
from ghofl.client.job import ClientJob
from ghofl.data.by_path import DatasetSpec
from ghofl.errors import ConfigError
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.stats.meta import EncoderInfo
from ghofl.stats.projection import default_basis

Log = Callable[[str], None]

CELL_KEYS = ("dataset", "encoder", "mode", "projection_dim", "alpha", "clients", "seed",
             "holdout", "transport_dtype")


def _cell_key(rec: dict[str, Any]) -> tuple[Any, ...]:
    if rec.get("mode") == "reference":
        return ("reference", rec["dataset"], rec["encoder"], rec["head"])
    return tuple(rec.get(k) for k in CELL_KEYS)


def _load_previous(path: Path, cfg: ExperimentConfig) -> tuple[list[dict[str, Any]], float]:
    """Records and wall seconds of an earlier run of the same config (for ``resume``)."""
    if not path.exists():
        return [], 0.0
    try:
        prev = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"cannot resume: {str(path)!r} is not valid JSON ({exc}); move it away or run "
            "without --resume"
        ) from None
    if not _same_config(prev.get("config"), cfg):
        raise ConfigError(
            f"cannot resume: {str(path)!r} was produced by a different configuration; use "
            "another --out folder or run without --resume"
        )
    records: list[dict[str, Any]] = prev.get("records", [])
    return records, float(prev.get("wall_seconds", 0.0))


def _same_config(previous: Any, cfg: ExperimentConfig) -> bool:
    """Whether a stored config equals ``cfg`` once both are normalised.

    Keys added to the config format later, at their defaults, do not block resuming.
    """
    from ghofl.bench.config import config_from_dict

    if not isinstance(previous, dict):
        return False
    try:
        prev = config_from_dict(previous)
    except ConfigError:
        return False
    return json.dumps(prev.to_dict(), sort_keys=True) == json.dumps(cfg.to_dict(), sort_keys=True)


def run_experiment(
    cfg: ExperimentConfig,
    out_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = False,
    log: Log | None = None,
    features: dict[tuple[str, str], Features] | None = None,
    plots: bool = True,
) -> list[dict[str, Any]]:
    """Run every federation of ``cfg`` and write ``results.json``, ``results.md`` and plots.

    ``features``, when given, is a memo of embedded splits keyed by ``(str(dataset),
    encoder)``: entries found there are used, others are loaded and stored (so several grids
    over the same data, like ``ghofl demo``'s, read it once). ``plots=False`` skips the PNGs.
    Returns the list of records.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = log or (lambda _msg: None)
    results_path = out / "results.json"
    records, earlier = _load_previous(results_path, cfg) if resume else ([], 0.0)
    done = {_cell_key(r) for r in records}
    started = time.time()

    def flush() -> None:
        wall = earlier + time.time() - started
        write_json(
            results_path, {"config": cfg.to_dict(), "records": records, "wall_seconds": wall}
        )

    total, cell = cfg.n_cells(), 0
    for dataset in cfg.datasets:
        for encoder in cfg.encoders:
            feats = _memo_features(features, dataset, encoder, cfg, progress, say)
            _run_references(cfg, feats, records, done, say)
            flush()
            for fed in _grid_cells(cfg):
                cell += 1
                key = (feats.dataset, feats.encoder_name, *fed.key())
                if key in done:
                    continue
                say(f"[{cell}/{total}] {feats.dataset} {feats.encoder_name} {fed.describe()}")
                res = _run_one(cfg, feats, fed.mode, fed.proj, fed.clients, fed.alpha,
                               fed.seed, fed.holdout, fed.tdtype, progress).to_dict()
                records.extend(_federation_records(feats, fed, res))
                done.add(key)
                flush()
    flush()
    _write_tables_and_plots(cfg, records, out, plots, say)
    return records


class _Cell(NamedTuple):
    """One federation of a grid: the config values that vary between federations."""

    mode: str
    proj: int
    alpha: float
    clients: int
    seed: int
    holdout: float | None
    tdtype: str | None

    def key(self) -> tuple[Any, ...]:
        """The cell's part of a record key (no projection is ``None``).

        In ``CELL_KEYS`` order, after dataset and encoder.
        """
        return (self.mode, self.proj or None, self.alpha, self.clients, self.seed,
                self.holdout, self.tdtype)

    def describe(self) -> str:
        """The cell in a progress line (holdout and transport only when not the default)."""
        return (
            f"mode={self.mode} proj={self.proj or '-'} alpha={self.alpha} "
            f"clients={self.clients} seed={self.seed}"
            + (f" holdout={self.holdout}" if self.holdout else "")
            + (f" transport={self.tdtype}" if self.tdtype else "")
        )


def _grid_cells(cfg: ExperimentConfig) -> list[_Cell]:
    """Every federation of one (dataset, encoder), in run order.

    Mode, projection, α, clients, then the upload variants (:func:`_upload_variants`).
    """
    return [
        _Cell(mode, proj, alpha, clients, seed, holdout, tdtype)
        for mode in cfg.modes
        for proj in cfg.projection_dims
        for alpha in cfg.alphas
        for clients in cfg.clients
        for seed, holdout, tdtype in _upload_variants(cfg)
    ]


def _memo_features(
    memo: dict[tuple[str, str], Features] | None,
    dataset: str | DatasetSpec,
    encoder: str,
    cfg: ExperimentConfig,
    progress: bool,
    say: Log,
) -> Features:
    """The embedded splits of ``dataset`` under ``encoder``.

    From ``memo`` when there, else loaded (and stored in ``memo`` when one is given).
    """
    memo_key = (str(dataset), encoder)
    if memo is not None and memo_key in memo:
        return memo[memo_key]
    feats = load_features(dataset, encoder, cfg, progress=progress, log=say)
    if memo is not None:
        memo[memo_key] = feats
    return feats


def _federation_records(
    feats: Features, fed: _Cell, res: dict[str, Any]
) -> list[dict[str, Any]]:
    """One record per head of a simulated federation (``res``: its result as a dict)."""
    return [
        {
            "dataset": feats.dataset,
            "encoder": feats.encoder_name,
            "mode": fed.mode,
            "projection_dim": fed.proj or None,
            "alpha": fed.alpha,
            "clients": fed.clients,
            "seed": fed.seed,
            "head": head,
            "accuracy": hres["accuracy"],
            "fit_seconds": hres["fit_seconds"],
            "predict_seconds": hres.get("predict_seconds"),
            "upload_bytes_per_client": res["upload_bytes_per_client"],
            "stage_seconds": res["stage_seconds"],
            "n_train": res["n_train"],
            "n_test": res["n_test"],
            "params": hres.get("params", {}),
            "protocol": res["aggregation"]["protocol"],
            "clip_norm": res["clip_norm"],
            "holdout": fed.holdout,
            "transport_dtype": fed.tdtype,
        }
        for head, hres in res["heads"].items()
    ]


def _write_tables_and_plots(
    cfg: ExperimentConfig, records: list[dict[str, Any]], out: Path, plots: bool, say: Log
) -> None:
    """Write ``results.md`` and, unless ``plots`` is false, the PNGs.

    The PNGs are skipped, with a log line, when matplotlib is missing.
    """
    from ghofl.bench.tables import write_markdown

    write_markdown(cfg, records, out / "results.md")
    if not plots:
        return
    try:
        from ghofl.bench.plots import write_plots

        write_plots(records, out)
    except ImportError as exc:  # matplotlib missing: tables still written
        say(f"plots skipped: {exc}")


def _upload_variants(
    cfg: ExperimentConfig,
) -> list[tuple[int, float | None, str | None]]:
    """(seed, holdout, transport dtype) of every federation of a grid cell.

    The defaults (no held-out section, float64) are ``None`` in records and keys, so results
    written before these options existed resume.
    """
    return [(seed, h or None, None if t == "float64" else t)
            for seed in cfg.seeds for h in cfg.holdout for t in cfg.transport_dtype]


def _run_one(cfg: ExperimentConfig, feats: Any, mode: str, proj: int, clients: int,
             alpha: float, seed: int, holdout: float | None, tdtype: str | None, progress: bool
             ) -> Any:
    """One grid cell: the plan of the experiment config's row, simulated."""
    from ghofl.server.simulation import Population, simulate

    heads = heads_for_mode(cfg.heads, mode)
    clip = resolve_clip(cfg, feats.encoder_info)
    job = ClientJob(tuple(feats.classes), mode, projection_dim=proj or None,  # type: ignore[arg-type]
                    projection_seed=cfg.projection_seed, clip_norm=clip,
                    holdout_fraction=holdout or 0.0, transport_dtype=tdtype or "float64",
                    projection_basis=default_basis(feats.encoder_info.fingerprint())
                    if proj and cfg.projection == "pca" else "")
    plan = FederationPlan(job, AggregationSpec("secure" if cfg.secure else "plain"),
                          ServerJob(tuple(heads), dict(cfg.head_params), seed=seed,
                                    progress=progress, preset=cfg.preset))
    return simulate(plan, (feats.x_train, feats.y_train), (feats.x_test, feats.y_test),
                    Population(clients, alpha, cfg.min_per_client, feats.encoder_info))


def resolve_clip(cfg: ExperimentConfig, info: EncoderInfo) -> float | None:
    """The clipping bound of a run.

    ``cfg.clip`` when > 0, else the encoder's default R when ``cfg.secure`` (a secure run needs
    one), else none.

    Raises
    ------
    ConfigError
        A secure run on an encoder without a default R and no ``clip`` in the config.
    """
    if cfg.clip > 0:
        return float(cfg.clip)
    if not cfg.secure:
        return None
    from ghofl.client.encoders import default_clip_norm

    found = default_clip_norm(info)
    if found is None:
        raise ConfigError(
            f"secure = true needs a clipping bound, and encoder {info.name!r} has no default "
            "one; set clip = R in the experiment config (R at or above the embeddings' norms)"
        )
    return found


def heads_for_mode(heads: tuple[str, ...], mode: str) -> list[str]:
    """The heads of ``heads`` that can be fitted from statistics of upload ``mode``."""
    from ghofl.heads.registry import head_class
    from ghofl.stats.schema import mode_supports

    return [h for h in heads if mode_supports(mode, head_class(h).min_mode)]


def _run_references(
    cfg: ExperimentConfig,
    feats: Features,
    records: list[dict[str, Any]],
    done: set[tuple[Any, ...]],
    say: Log,
) -> None:
    """Append a record for every centralised reference of ``cfg`` on ``feats``.

    Only references not yet in ``done``; their keys are added there.
    """
    for ref in cfg.references:
        key = ("reference", feats.dataset, feats.encoder_name, ref)
        if key in done:
            continue
        say(f"reference {ref} on {feats.dataset} / {feats.encoder_name}")
        r = run_reference(ref, feats.x_train, feats.y_train, feats.x_test, feats.y_test)
        records.append(
            {
                "dataset": feats.dataset,
                "encoder": feats.encoder_name,
                "mode": "reference",
                "projection_dim": None,
                "alpha": None,
                "clients": None,
                "seed": None,
                "head": ref,
                "accuracy": r.accuracy,
                "fit_seconds": r.fit_seconds,
                "upload_bytes_per_client": None,
                "details": r.details,
                "n_train": len(feats.y_train),
                "n_test": len(feats.y_test),
            }
        )
        done.add(key)
