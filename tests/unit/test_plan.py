"""The federation plan: its cross-field rules (one place, rendered per front end), the field
table (every name real, the docs generated from it) and the server entry point."""

from __future__ import annotations

import ast
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError
from ghofl.privacy import DPConfig
from ghofl.secure import InMemoryTransport, PlainClient, SecAggClient
from ghofl.server import (
    CLI,
    CONFIG,
    FIELDS,
    LIBRARY,
    AggregationSpec,
    FederationPlan,
    FederationServer,
    Naming,
    PlanError,
    key_table,
)
from ghofl.server.config import plan_from_config, plan_to_config
from ghofl.server.job import ServerJob
from ghofl.stats.accumulate import compute_stats

ROOT = Path(__file__).resolve().parents[2]
JOB = ClientJob(("a", "b"), "full", clip_norm=5.0)
SERVER = ServerJob(("nb", "lda"))

# (case, build, field, message per naming)
RULES: list[tuple[str, Any, str, dict[str, str]]] = [
    ("float32-secure",
     lambda: FederationPlan(ClientJob(("a",), clip_norm=1.0, transport_dtype="float32"),
                            AggregationSpec("secure"), SERVER),
     "client.transport_dtype",
     {"library": r"^ClientJob transport_dtype 'float32' applies to plain uploads; .* so set "
                 r"ClientJob transport_dtype = \"float64\" or AggregationSpec protocol = "
                 r"\"plain\"$",
      "cli": r"^--transport-dtype 'float32' applies .* so drop --transport-dtype or --secure$",
      "config": r"^transport_dtype 'float32' applies .* so set transport_dtype = \"float64\" "
                r"or protocol = \"plain\"$"}),
    ("secure-no-clip",
     lambda: FederationPlan(ClientJob(("a",)), AggregationSpec("secure"), SERVER),
     "client.clip_norm",
     {"library": r"^AggregationSpec protocol = \"secure\" needs ClientJob clip_norm: the "
                 r"fixed-point",
      "cli": r"^--secure needs --clip R: the fixed-point encoding of the secure sum",
      "config": r"^protocol = \"secure\" needs clip_norm: "}),
    ("dp-no-clip",
     lambda: FederationPlan(ClientJob(("a",)), AggregationSpec(dp=DPConfig(1.0)), SERVER),
     "client.clip_norm",
     {"library": r"^AggregationSpec dp_epsilon needs ClientJob clip_norm: without a "
                 r"per-sample",
      "cli": r"^--dp-epsilon needs --clip R: .*the sensitivity of the statistics depends on it$",
      "config": r"^dp_epsilon needs clip_norm: "}),
    ("holdout-dp",
     lambda: FederationPlan(ClientJob(("a",), clip_norm=1.0, holdout_fraction=0.2),
                            AggregationSpec(dp=DPConfig(1.0)), SERVER),
     "client.holdout_fraction",
     {"library": r"count twice in the sensitivity\); set ClientJob holdout_fraction = 0\.0 "
                 r"or AggregationSpec dp_epsilon = 0\.0$",
      "cli": r"count twice in the sensitivity\); drop --holdout or --dp-epsilon$",
      "config": r"set holdout_fraction = 0\.0 or dp_epsilon = 0\.0$"}),
    ("distributed-plain",
     lambda: AggregationSpec(dp=DPConfig(1.0, mode="distributed")),
     "aggregation.dp_mode",
     {"library": r"^AggregationSpec dp_mode = \"distributed\" adds each client's noise",
      "cli": r"^--dp-mode distributed adds each client's noise share before secure "
             r"aggregation, so it needs --secure; add it, or use --dp-mode central$",
      "config": r"needs protocol = \"secure\"; add it, or use dp_mode = \"central\"$"}),
    ("threshold-plain", lambda: AggregationSpec(threshold=3), "aggregation.threshold",
     {"library": r"^AggregationSpec threshold only applies to the secure protocol; add "
                 r"AggregationSpec protocol = \"secure\"$",
      "cli": r"^--threshold only applies to the secure protocol; add --secure$",
      "config": r"^threshold only applies to the secure protocol; add protocol = \"secure\"$"}),
    ("limbs-plain", lambda: AggregationSpec(limbs=1), "aggregation.limbs",
     {"library": r"^AggregationSpec limbs only applies", "cli": r"^--limbs only applies",
      "config": r"^limbs only applies"}),
    ("store-secure", lambda: AggregationSpec("secure", store="x.db"), "aggregation.store",
     {"library": r"^AggregationSpec store records each client's contribution",
      "cli": r"^--store records .*; drop --store or --secure$",
      "config": r"^store records .*; set store = \"\" or protocol = \"plain\"$"}),
    ("holdout-seed", lambda: ClientJob(("a",), holdout_seed=-1), "client.holdout_seed",
     {"library": r"^ClientJob holdout_seed must be an integer >= 0; got -1$",
      "cli": r"^--holdout-seed must be an integer >= 0; got -1$",
      "config": r"^holdout_seed must be an integer >= 0; got -1$"}),
    ("clip", lambda: ClientJob(("a",), clip_norm=-1.0), "client.clip_norm",
     {"library": r"^ClientJob clip_norm \(the per-sample L2 clipping bound R\) must be",
      "cli": r"^--clip \(the per-sample L2 clipping bound R\) must be a finite number > 0",
      "config": r"^clip_norm \(the per-sample"}),
    ("transform", lambda: ClientJob(("a",), feature_transform="cube"),
     "client.feature_transform",
     {"library": r"^ClientJob feature_transform must be one of none, sqrt",
      "cli": r"^--feature-transform must be one of none, sqrt",
      "config": r"^feature_transform must be one of none, sqrt"}),
    ("protocol", lambda: AggregationSpec("tls"),  # type: ignore[arg-type]
     "aggregation.protocol",
     {"library": r"^AggregationSpec protocol must be 'secure' or 'plain'; got 'tls'$",
      "cli": r"^--secure must be 'secure' or 'plain'", "config": r"^protocol must be"}),
]


@pytest.mark.parametrize(("case", "build", "field", "messages"), RULES,
                         ids=[r[0] for r in RULES])
@pytest.mark.parametrize("naming", [LIBRARY, CLI, CONFIG], ids=lambda n: n.style)
def test_every_rule_names_its_field_in_each_vocabulary(case: str, build: Any, field: str,
                                                       messages: dict[str, str],
                                                       naming: Naming) -> None:
    with pytest.raises(PlanError) as info:
        build()
    assert info.value.field == field
    assert isinstance(info.value, ConfigError)
    import re

    assert re.search(messages[naming.style], info.value.render(naming)), \
        info.value.render(naming)
    assert str(info.value) == info.value.render(LIBRARY)


def test_a_front_end_hint_is_appended_as_a_sentence() -> None:
    with pytest.raises(PlanError) as info:
        FederationPlan(ClientJob(("a",)), AggregationSpec("secure"), SERVER)
    assert info.value.render(CLI, "Give --clip 8.4").endswith(
        "needs a per-sample clipping bound. Give --clip 8.4")


@pytest.mark.parametrize("client", [
    ClientJob(("a",), clip_norm=1.0, holdout_fraction=0.2),
    ClientJob(("a",), transport_dtype="float32"),
])
def test_allowed_combinations_build(client: ClientJob) -> None:
    protocol = "secure" if client.transport_dtype == "float64" else "plain"
    plan = FederationPlan(client, AggregationSpec(protocol), SERVER)
    assert plan.secure == (protocol == "secure")
    if plan.secure:
        assert plan.secagg_config().clip_norm == 1.0


def test_secure_parameters_are_checked_when_the_plan_is_built() -> None:
    with pytest.raises(ConfigError, match=r"the threshold must be at least 2"):
        FederationPlan(JOB, AggregationSpec("secure", threshold=1), SERVER)
    with pytest.raises(ConfigError, match=r"secagg_config\(\) is for plans with the secure"):
        FederationPlan(JOB, AggregationSpec(), SERVER).secagg_config()


# ---------------------------------------------------------------------- the field table
def _part_fields(part: str) -> set[str]:
    if part == "client":
        return {f.name for f in fields(ClientJob)}
    if part == "server":
        return {f.name for f in fields(ServerJob)}
    return {f.name for f in fields(AggregationSpec)} | {"dp_epsilon", "dp_delta", "dp_mode", "dp_split",
                                                        "dp_expected_samples", "dp_subspace",
                                                        "dp_prior"}


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_every_declared_field_exists_in_its_part(path: str) -> None:
    part, name = path.split(".")
    assert name in _part_fields(part)
    assert FIELDS[path].path == path


def test_every_declared_flag_is_an_option_of_a_command() -> None:
    from click import Option

    from ghofl.cli.main import build_command

    flags = set()
    for command in build_command().commands.values():  # type: ignore[attr-defined]
        for p in command.params:
            if isinstance(p, Option):
                flags.update(p.opts)
    missing = sorted(f.flag for f in FIELDS.values() if f.flag and f.flag not in flags)
    assert missing == []


def test_every_declared_config_key_is_read_by_the_run_config() -> None:
    """The Flower example declares every run-config key of the table (less the
    simulation-only drops and regions and the per-experiment classes)."""
    text = (ROOT / "examples" / "flower_app" / "pyproject.toml").read_text(encoding="utf-8")
    keys = {f.key for f in FIELDS.values()
            if f.path not in ("aggregation.drops", "aggregation.regions")}
    missing = sorted(k for k in keys if f"\n{k} =" not in text and f'\n"{k}" =' not in text)
    assert missing == []


def test_the_docs_key_table_is_the_generated_one() -> None:
    docs = (ROOT / "docs" / "file-formats.md").read_text(encoding="utf-8")
    assert key_table() in docs, "regenerate with python -c 'from ghofl.server import " \
                                "key_table; print(key_table())'"


def test_plan_from_a_run_config() -> None:
    cfg = {"classes": json.dumps(["a", "b"]), "heads": "nb,lda", "clip_norm": 2.0,
           "protocol": "secure", "threshold": 3, "dp_epsilon": 1.0}
    plan = plan_from_config(cfg)
    assert plan.secure and plan.secagg_config().threshold == 3
    assert plan.client.min_class_count == 5  # the DP default of the minimum-count rule
    assert plan.clients_job.min_class_count == 1  # ... applied by the server, not the clients
    assert plan.aggregation.dp is not None and plan.aggregation.dp.epsilon == 1.0
    plain = plan_from_config({**cfg, "protocol": "plain", "threshold": 0, "dp_epsilon": 0.0})
    assert not plain.secure and plain.client.min_class_count == 1


@pytest.mark.parametrize("plan", [
    FederationPlan(ClientJob(("a", "b"))),
    FederationPlan(ClientJob(("a", "b", "c"), mode="pooled", clip_norm=3.0, min_class_count=4,
                             holdout_fraction=0.2, holdout_seed=7, transport_dtype="float32",
                             feature_transform="sqrt", projection_dim=2, projection_seed=9),
                   AggregationSpec(store="s.db"),
                   ServerJob(("nb", "lda"), {"lda": {"shrinkage": 0.25}}, seed=3,
                             preset="paper")),
    FederationPlan(ClientJob(("a", "b"), clip_norm=2.0, min_class_count=6),
                   AggregationSpec("secure", threshold=3, neighbours=4, max_samples=500,
                                   limbs=1, dp=DPConfig(2.0, 1e-6, "distributed"))),
], ids=["defaults", "plain-everything", "secure-dp"])
def test_a_plan_survives_its_run_config(plan: FederationPlan) -> None:
    cfg = plan_to_config(plan)
    assert plan_from_config(cfg) == plan
    assert set(cfg) == {f.key for f in FIELDS.values() if f.key}  # all but the simulated drops
    assert all(isinstance(v, str | int | float | bool) for v in cfg.values())


# ---------------------------------------------------------------------- the server
def _payloads(seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(4):
        x = rng.normal(size=(30, 3))
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True) / 4.0, 1.0)
        out.append(compute_stats(x, rng.integers(0, 2, size=30), ("a", "b"), clip_norm=5.0))
    return out


@pytest.mark.parametrize("protocol", ["plain", "secure"])
def test_the_server_gives_the_exact_total_under_either_protocol(protocol: str) -> None:
    from ghofl.stats import sum_stats

    payloads = _payloads(0)
    ids = [f"c{i}" for i in range(4)]
    plan = FederationPlan(JOB, AggregationSpec(protocol), SERVER)  # type: ignore[arg-type]
    meta = payloads[0].meta
    halves = ([SecAggClient(c, p, meta=meta, allow_unauthenticated=True)
               for c, p in zip(ids, payloads, strict=True)]
              if protocol == "secure" else
              [PlainClient(c, p) for c, p in zip(ids, payloads, strict=True)])
    server = FederationServer(plan, ids, meta)
    out = server.aggregate(InMemoryTransport(halves, seed=0))
    exact = sum_stats(payloads)
    np.testing.assert_allclose(out.total.sums, exact.sums, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(out.total.counts, exact.counts)
    assert out.privacy is None and out.report.protocol == protocol
    fitted = server.fit(out.total)
    assert set(fitted.heads) == {"nb", "lda"}


def test_the_server_records_accepted_contributions_in_the_plans_store(tmp_path: Path) -> None:
    from ghofl.store import AggregationStore

    payloads = _payloads(1)
    ids = [f"c{i}" for i in range(4)]
    db = tmp_path / "fed.db"
    plan = FederationPlan(JOB, AggregationSpec(store=str(db)), SERVER)
    server = FederationServer(plan, ids, payloads[0].meta, store_id=lambda c: f"site-{c}")
    server.aggregate(InMemoryTransport([PlainClient(c, p) for c, p in zip(ids, payloads,
                                                                          strict=True)]))
    with AggregationStore(db) as store:
        assert sorted(c.client_id for c in store.contributions()) == [f"site-c{i}" for i in range(4)]


def test_central_dp_release_is_seeded_by_the_given_generator() -> None:
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    payloads = _payloads(2)
    ids = [f"c{i}" for i in range(4)]
    plan = FederationPlan(ClientJob(("a", "b"), clip_norm=5.0, min_class_count=1),
                          AggregationSpec(dp=DPConfig(2.0)), SERVER)
    runs = []
    for _ in range(2):
        server = FederationServer(plan, ids, payloads[0].meta)
        runs.append(server.aggregate(
            InMemoryTransport([PlainClient(c, p) for c, p in zip(ids, payloads, strict=True)]),
            noise_rng=np.random.default_rng(7)))
    assert runs[0].privacy is not None and runs[0].privacy["dp_mode"] == "central"
    np.testing.assert_array_equal(runs[0].total.sums, runs[1].total.sums)


PROTOCOL_CONSTRUCTORS = ("SecAggServer", "PlainServer", "NoisyDecoder", "release_central")


def test_protocol_servers_and_dp_releases_are_built_only_in_server() -> None:
    """Every front end goes through ghofl.server: no other module of the library builds a
    protocol's server half or a DP release (the hierarchical protocol gets its server
    halves' constructor from ghofl.server)."""
    src = ROOT / "src" / "ghofl"
    offenders = []
    for path in src.rglob("*.py"):
        if path.parent.name == "server":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
                if name in PROTOCOL_CONSTRUCTORS:
                    offenders.append(f"{path.relative_to(src)}:{node.lineno} {name}")
    assert offenders == []
