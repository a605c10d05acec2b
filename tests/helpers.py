"""Shared test-data makers (import as ``from tests.helpers import ...``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray


def gaussian_mixture(
    seed: int,
    num_classes: int = 4,
    dim: int = 8,
    n: int = 600,
    sep: float = 2.0,
    class_cov: bool = True,
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Labelled Gaussian data: class means ~ N(0, sep²), per-class random covariances.

    Returns ``(x (n, dim) float64, y (n,) int64)``; every class appears at least twice.
    """
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=sep, size=(num_classes, dim))
    y = np.concatenate(
        [
            np.repeat(np.arange(num_classes), 2),
            rng.integers(0, num_classes, max(n - 2 * num_classes, 0)),
        ]
    )
    rng.shuffle(y)
    x = np.empty((y.size, dim))
    for c in range(num_classes):
        idx = np.flatnonzero(y == c)
        a = rng.normal(size=(dim, dim)) / np.sqrt(dim) if class_cov else np.eye(dim)
        x[idx] = means[c] + rng.normal(size=(idx.size, dim)) @ (a + 0.5 * np.eye(dim))
    return x, y.astype(np.int64)


def numbered(num_classes: int) -> tuple[str, ...]:
    """Class names ``"0"`` … ``"C-1"``: the :class:`~ghofl.client.job.ClientJob` class list of
    data without names (what ``--num-classes C`` gives on the CLI)."""
    return tuple(str(c) for c in range(num_classes))


def policy_for(config: object, **overrides: object) -> object:
    """The client policy that accepts ``config``'s explicit threshold and degree (tests that
    run small or sparse rounds on purpose); the default policy when it sets neither."""
    from ghofl.secure.policy import ClientPolicy

    t, k = getattr(config, "threshold", None), getattr(config, "neighbours", None)
    kwargs: dict[str, object] = {
        name: getattr(config, name) for name in ("corrupt_fraction", "dropout_fraction",
                                                 "sigma", "eta") if hasattr(config, name)}
    if t is not None:
        kwargs["trust_server"] = True
    if k is not None:
        kwargs["min_neighbours"] = k
    kwargs.update(overrides)
    return ClientPolicy(**kwargs)  # type: ignore[arg-type]


def pooled_payloads(n: int, *, seed: int = 0, dim: int = 5, rows: int = 40,
                    clip: float = 6.0) -> list[object]:
    """n clients' ``pooled`` statistics of 3 Gaussian classes (client i draws seed·100 + i)."""
    from ghofl.stats.accumulate import compute_stats

    out: list[object] = []
    for i in range(n):
        x, y = gaussian_mixture(seed * 100 + i, 3, dim, n=rows)
        out.append(compute_stats(x, y, 3, "pooled", clip_norm=clip))
    return out


def secure_federation(ids: list[str], payloads: list[object], config: object, *,
                      policy: object | None = None, ledger: object = None,
                      **server_kwargs: object
                      ) -> tuple[list[object], object, dict[str, object], object]:
    """Honest clients with identity keys, the roster of those keys, and a server over it.

    The clients keep no round ledger unless ``ledger`` says so (``"default"``: each its own
    default ledger file), so a test may run rounds over the same data again.

    Returns
    -------
    (clients, server, identities, roster)
    """
    from ghofl.secure import SecAggClient, SecAggServer
    from ghofl.secure.identity import IdentityKey, Roster

    identities = {c: IdentityKey.generate() for c in ids}
    roster = Roster.from_identities(identities)
    pol = policy if policy is not None else policy_for(config)
    clients = [SecAggClient(c, p, identity=identities[c], roster=roster,  # type: ignore[arg-type]
                            policy=pol, ledger=ledger)  # type: ignore[arg-type]
               for c, p in zip(ids, payloads, strict=True)]
    meta = payloads[0].meta  # type: ignore[attr-defined]
    server = SecAggServer(config, meta, ids, roster=roster, **server_kwargs)  # type: ignore[arg-type]
    return clients, server, identities, roster  # type: ignore[return-value]


def protocol_setting(setting: str) -> tuple[float | None, object]:
    """(clip bound, AggregationSpec) of a protocol setting: ``plain``, ``secure``,
    ``central-dp`` or ``distributed-dp`` (ε = 8, R = 30 where clipping is needed)."""
    from ghofl.privacy import DPConfig
    from ghofl.server.plan import AggregationSpec

    specs = {
        "plain": (None, AggregationSpec()),
        "secure": (30.0, AggregationSpec("secure")),
        "central-dp": (30.0, AggregationSpec(dp=DPConfig(epsilon=8.0))),
        "distributed-dp": (30.0, AggregationSpec("secure",
                                                 dp=DPConfig(epsilon=8.0, mode="distributed"))),
    }
    return specs[setting]


def load_script(path: object, name: str) -> object:
    """Import the script at ``path`` as module ``name``, its folder on ``sys.path`` meanwhile.

    The benchmark scripts import their neighbours (``from bench_x import ...``), so their folder
    must be importable while they load.
    """
    import importlib.util
    import sys
    from pathlib import Path

    folder = str(Path(str(path)).parent)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, str(path))
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(folder)
    return mod


def dp_release(total: Any, clip: float, z: float, *, seed: int, aware: bool = True) -> Any:
    """``total`` noised at noise multiplier z (budget split equally over its blocks, ε = 8 in
    the plan's record), post-processed; a ``NoisyStats`` carrying σ unless ``aware`` is False."""
    from ghofl.privacy import DPConfig, NoisePlan, block_sensitivities, block_sigmas, draw_noise
    from ghofl.privacy.postprocess import postprocess
    from ghofl.stats.schema import schema_for

    mode = total.mode
    c, d = total.meta.num_classes, total.meta.dim
    sens = block_sensitivities(mode, clip)
    frac = {b: 1.0 / len(sens) for b in sens}
    sigma = block_sigmas(sens, frac, z)
    ints, floats = schema_for(mode).flatten(total)
    plan = NoisePlan(DPConfig(8.0), mode, clip, 1, z, sens, frac, sigma)
    dc, df = draw_noise(plan, c, d, np.random.default_rng(seed))
    stats, _ = postprocess(total.meta, ints[:c] + dc, floats + df, 1, sigma if aware else None)
    return stats


class FakeGrid:
    """A Flower grid of nodes 0..n-1 in process: each message goes to ghofl's ClientApp
    handler with the node's own Context, kept across the run (as a SuperNode keeps
    ``context.state``). Import after ``pytest.importorskip("flwr")``.

    Message ids are ``m<k>``, k the number of messages pending; ``unique_ids`` appends the
    monotonic clock so that no id repeats over a run. ``asked`` counts the node-id queries and
    ``pushed`` holds the pending (node, content) pairs by id.
    """

    def __init__(self, node_cfgs: list[dict[str, Any]], run_cfg: dict[str, Any], *,
                 unique_ids: bool = False) -> None:
        from flwr.app import Context, RecordDict

        self.contexts = [Context(1, i, cfg, RecordDict(), run_cfg)
                         for i, cfg in enumerate(node_cfgs)]
        self.pushed: dict[str, tuple[int, Any]] = {}
        self.asked = 0
        self.unique_ids = unique_ids

    def get_node_ids(self) -> list[int]:
        self.asked += 1
        return list(range(len(self.contexts)))

    def push_messages(self, messages: list[Any]) -> list[str]:
        import time

        ids = []
        for m in messages:
            mid = f"m{len(self.pushed)}"
            if self.unique_ids:
                mid += f"-{time.monotonic_ns()}"
            self.pushed[mid] = (int(m.metadata.dst_node_id), m.content)
            ids.append(mid)
        return ids

    def pull_messages(self, ids: set[str]) -> list[Any]:
        from types import SimpleNamespace

        from ghofl.integrations.flower.client_app import handle_query

        out = []
        for mid in sorted(ids):
            node, content = self.pushed.pop(mid)
            out.append(SimpleNamespace(
                metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=mid),
                has_error=lambda: False, content=handle_query(content, self.contexts[node])))
        return out


def assert_overflow_refused(d: int) -> None:
    """One class of dimension d whose off-diagonal entries (1e300) lie so far beyond a tiny
    diagonal (1e-10) that M / σ² overflows: ClientStats refuses it, its smallest eigenvalue
    read as −inf times the scale."""
    import pytest

    from ghofl.errors import StatsValidationError
    from ghofl.stats import ClientStats, StatsMeta

    m = np.eye(d) * 1e-10
    m[0, 1] = m[1, 0] = 1e300
    meta = StatsMeta("full", d, ("only",))
    with pytest.raises(StatsValidationError, match=r"class 'only' .* smallest eigenvalue is "
                       r"-inf times the scale"):
        ClientStats(meta, counts=np.array([4]), sums=np.zeros((1, d)), class_scatter=m[None])
