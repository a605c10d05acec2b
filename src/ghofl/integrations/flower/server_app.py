"""The Flower ServerApp of ghofl: wait for the nodes, aggregate, fit, save, score.

Run config keys (see ``examples/flower_app/pyproject.toml`` for the documented defaults):

* ``protocol``: ``"secure"`` or ``"plain"``;
* the secure round: ``threshold`` (0 = strict majority), ``neighbours`` (0 = default),
  ``max-samples``, ``limbs``; its clipping bound is the client job's ``clip_norm``;
* the :class:`~ghofl.client.job.ClientJob` keys (``classes``, ``mode``, ``clip_norm``,
  ``holdout_fraction``, ``holdout_seed``, ``transport_dtype``, ...; float32 transport only with
  the plain protocol) and the :class:`~ghofl.server_job.ServerJob` keys (``heads``,
  ``head_params``, ``seed``, ``preset``, ...);
* differential privacy: ``dp-epsilon`` (0 = none), ``dp-delta``, ``dp-mode`` (``central``:
  the server noises the total; ``distributed``: every client adds a noise share, needs the
  secure protocol) and ``min-class-count`` (0 = 5 with DP, else off); the spent (ε, δ) is
  recorded in the model directory's manifest (``privacy``) and in ``results.json``;
* ``dim``: embedding dimension (0 = from the test set or the encoder);
* ``expected-nodes``, ``wait-timeout-s``, ``stage-timeout-s``;
* ``out-dir`` (required): receives ``model/`` (the model directory, written atomically),
  ``total.ghs`` (the aggregate the heads were fitted from) and ``results.json``;
  ``test-path``: an optional ``.npz`` test set scored on the server.

``results.json`` is written atomically: ``status: "ok"`` with the accuracy per head, per-stage
seconds and bytes, survivors, dropped and excluded clients (with each node's partition id), or
``status: "failed"`` with the error (then the ServerApp raises). ``flwr run --stream`` exits 0
even when the ServerApp raised: read ``results.json``.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.errors import require_extra

require_extra("flwr", "flower")

from flwr.app import Context  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from ghofl.client.job import ClientJob  # noqa: E402
from ghofl.client.transforms import apply_feature_transform  # noqa: E402
from ghofl.data.embeddings import align_labels, load_embeddings  # noqa: E402
from ghofl.errors import ConfigError  # noqa: E402
from ghofl.files import write_json_atomic  # noqa: E402
from ghofl.integrations.flower._config import (  # noqa: E402
    cfg_float,
    cfg_int,
    cfg_str,
    dp_options,
    job_meta,
)
from ghofl.integrations.flower.transport import FlowerTransport  # noqa: E402
from ghofl.privacy import NoisyDecoder, release_central  # noqa: E402
from ghofl.secure import (  # noqa: E402
    PlainServer,
    SecAggConfig,
    SecAggServer,
    run_aggregation,
)
from ghofl.secure.fixedpoint import DEFAULT_MAX_SAMPLES  # noqa: E402
from ghofl.server_job import ServerJob, run_server_job  # noqa: E402
from ghofl.stats.codec import save_stats  # noqa: E402
from ghofl.store import AggregationStore  # noqa: E402

__all__ = ["RESULTS", "TOTAL", "app", "run_federation", "wait_for_nodes"]

RESULTS = "results.json"
#: The aggregate (sum of the survivors' statistics), what ``ghofl fit`` takes.
TOTAL = "total.ghs"

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of ``flwr run``: see the module docstring."""
    cfg = dict(context.run_config)
    out_dir = Path(cfg_str(cfg, "out-dir") or "ghofl-flower-out")
    state: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        summary = run_federation(grid, cfg, out_dir, state)
    except BaseException as exc:
        failed = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                  "seconds": time.perf_counter() - t0, **state,
                  "traceback": traceback.format_exc(limit=8)}
        write_json_atomic(out_dir / RESULTS, failed, default=str)
        raise
    summary["seconds"] = time.perf_counter() - t0
    write_json_atomic(out_dir / RESULTS, summary, default=str)


def wait_for_nodes(grid: Any, expected: int, timeout_s: float, poll_s: float = 0.5
                   ) -> list[int]:
    """Poll ``grid.get_node_ids()`` until ``expected`` nodes are connected; return them (all
    connected nodes, sorted).

    Raises
    ------
    ConfigError
        Fewer nodes connected within ``timeout_s`` seconds.
    """
    if expected < 1:
        raise ConfigError(f"expected-nodes must be at least 1; got {expected}")
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= expected:
            return nodes
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"only {len(nodes)} of the {expected} expected Flower nodes connected within "
                f"{timeout_s:g} s (wait-timeout-s); start the missing SuperNodes or lower "
                "expected-nodes"
            )
        time.sleep(poll_s)


def run_federation(grid: Any, cfg: Mapping[str, Any], out_dir: Path,
                   state: dict[str, Any]) -> dict[str, Any]:
    """The whole server side; fills ``state`` as it goes (for the failure report)."""
    protocol = cfg_str(cfg, "protocol", "secure")
    if protocol not in ("secure", "plain"):
        raise ConfigError(f"run config key 'protocol' must be 'secure' or 'plain'; got "
                          f"{protocol!r}")
    state["protocol"] = protocol
    job, plan = dp_options(cfg, ClientJob.from_config(cfg))
    distributed = plan is not None and plan.config.mode == "distributed"
    if distributed and protocol != "secure":
        raise ConfigError("run config dp-mode 'distributed' needs protocol 'secure'")
    _check_upload_options(job, protocol, dp=plan is not None)
    server_job = ServerJob.from_config(cfg)
    test = _load_test(cfg_str(cfg, "test-path"), job)
    dim = cfg_int(cfg, "dim") or (None if test is None else int(test[0].shape[1]))
    meta = job_meta(job, dim)

    t_wait = time.perf_counter()
    nodes = wait_for_nodes(grid, cfg_int(cfg, "expected-nodes", 2),
                           cfg_float(cfg, "wait-timeout-s", 120.0))
    state["wait_seconds"] = time.perf_counter() - t_wait
    ids = {f"node-{n}": n for n in nodes}
    state["nodes"] = {c: {"node_id": n} for c, n in ids.items()}
    server: SecAggServer | PlainServer
    decoder = None
    store: AggregationStore | None = None
    if protocol == "secure":
        if job.clip_norm is None:
            raise ConfigError(
                "the secure protocol needs a clipping bound: set the run config key clip_norm "
                "(R > 0)"
            )
        secagg = SecAggConfig(
            clip_norm=job.clip_norm,
            threshold=cfg_int(cfg, "threshold") or None,
            neighbours=cfg_int(cfg, "neighbours") or None,
            max_samples=cfg_int(cfg, "max-samples", DEFAULT_MAX_SAMPLES),
            limbs=cfg_int(cfg, "limbs", 2),
        )
        decoder = NoisyDecoder(plan) if distributed and plan is not None else None
        server = SecAggServer(secagg, meta, list(ids), decode=decoder)
    else:
        store_path = cfg_str(cfg, "store")
        if store_path:  # record every accepted contribution durably (plain protocol only)
            store = AggregationStore(Path(store_path))
            state["store"] = store_path
            server = PlainServer(list(ids), meta, on_accept=lambda c, stats: store.add(
                _store_id(c, transport), stats))
        else:
            server = PlainServer(list(ids), meta)
    transport = FlowerTransport(grid, ids, cfg_float(cfg, "stage-timeout-s", 60.0))
    try:
        report = run_aggregation(server, transport)
    finally:
        if store is not None:
            store.close()
        for c, part in transport.partitions.items():
            state["nodes"][c]["partition_id"] = part
        state.update(
            stage_seconds=dict(transport.stage_seconds),
            dropped=dict(server.dropped), excluded=dict(server.excluded),
            problems=dict(transport.problems),
        )
    agg = report.to_dict()
    state.update(survivors=agg["survivor_ids"], aggregation=agg,
                 bytes={s: {"server_sent": r.server_sent_bytes,
                            "server_received": r.server_received_bytes}
                        for s, r in report.stages.items()})
    total = report.total
    extra: dict[str, Any] = {"source": f"flower ({protocol} protocol, {len(ids)} nodes)"}
    if plan is not None:  # the noise comes from OS entropy
        release = decoder.release if decoder is not None else release_central(
            total, plan, np.random.default_rng())
        assert release is not None
        total = release.stats
        extra["privacy"] = state["privacy"] = release.to_dict()
    save_stats(total, out_dir / TOTAL)
    t_fit = time.perf_counter()
    result = run_server_job(total, server_job, out_dir=out_dir / "model", test=test,
                            extra=extra)
    state["fit_seconds"] = time.perf_counter() - t_fit
    server_summary = result.to_dict()
    accuracy = {name: h["accuracy"] for name, h in server_summary["heads"].items()
                if "accuracy" in h}
    return {"status": "ok", **state, "accuracy": accuracy, "server": server_summary,
            "n_samples": total.n_samples, "n_clipped": total.n_clipped}


def _check_upload_options(job: ClientJob, protocol: str, dp: bool) -> None:
    """Held-out sections and float32 transport: refuse the combinations they do not support
    (as the in-process simulator does), before any node is asked for anything."""
    if job.transport_dtype != "float64" and protocol == "secure":
        raise ConfigError(
            f"run config transport_dtype {job.transport_dtype!r} applies to plain uploads; the "
            "secure protocol sends its own fixed-point encoding of the float64 sums, so set "
            "transport_dtype = \"float64\" or protocol = \"plain\""
        )
    if job.holdout_fraction > 0 and dp:
        raise ConfigError(
            "differential privacy does not support a held-out section (held-out samples would "
            "count twice in the sensitivity); set the run config holdout_fraction = 0.0 or "
            "dp-epsilon = 0.0"
        )


def _store_id(client: str, transport: FlowerTransport) -> str:
    """The store's id of a node's contribution: its partition id when it reported one (stable
    across runs, so re-running is idempotent), else its Flower node id."""
    part = transport.partitions.get(client)
    return f"partition-{part}" if part is not None else client


def _load_test(path: str, job: ClientJob) -> tuple[Any, Any] | None:
    if not path:
        return None
    emb = load_embeddings(Path(path), "test-path")
    labels = align_labels(emb.y, emb.classes, job.classes, f"'{path}'")
    # the heads score what the clients summed: the job's transform of the embeddings
    return apply_feature_transform(emb.x, job.feature_transform), labels
