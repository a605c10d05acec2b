"""simulate(plan, ...): invariance to the split, reported sizes and timings, fail-fast checks."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, InputError, UnsupportedModeError
from ghofl.heads import registry
from ghofl.heads.build import build_heads, head_defaults
from ghofl.heads.nb import NBDiagHead
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server.simulation import Population, SimulationResult, simulate
from ghofl.stats import Mode, ProjectionSpec, compute_stats, payload_nbytes
from tests.helpers import gaussian_mixture, numbered

CLOSED = ["nb", "lda", "qda", "fedcgs"]
NAMES = numbered(4)
JOB = ClientJob(NAMES)
SERVER = ServerJob(tuple(CLOSED))


class SeededHead(NBDiagHead):
    """A test head taking ``seed`` and ``progress`` like the trainable heads do."""

    name = "seeded"

    def __init__(self, var_smoothing: float = 1e-9, seed: int = 0, progress: bool = False) -> None:
        super().__init__(var_smoothing)
        self.seed = seed
        self.progress = progress


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    x, y = gaussian_mixture(3, num_classes=4, dim=6, n=900, sep=1.2)
    return {"xtr": x[:700], "ytr": y[:700], "xte": x[700:], "yte": y[700:]}


def _run(data: dict[str, np.ndarray], job: ClientJob = JOB,
         aggregation: AggregationSpec | None = None, server: ServerJob = SERVER,
         clients: int = 10, alpha: float = 0.5) -> SimulationResult:
    """``plan`` (default: 4 classes, the plain sum, the closed-form heads) over ``clients``
    Dirichlet(``alpha``) clients of the module's data."""
    plan = FederationPlan(job, aggregation or AggregationSpec(), server)
    return simulate(plan, (data["xtr"], data["ytr"]), (data["xte"], data["yte"]),
                    Population(clients, alpha))


def _same_outcome(a: Any, b: Any) -> None:
    for name in CLOSED:
        assert a.heads[name].accuracy == b.heads[name].accuracy, name
        np.testing.assert_array_equal(a.predictions[name], b.predictions[name])


def test_accuracy_is_independent_of_alpha(data: dict[str, np.ndarray]) -> None:
    a, b = _run(data, alpha=0.05), _run(data, alpha=0.5)
    assert a.client_sizes != b.client_sizes
    _same_outcome(a, b)


def test_accuracy_is_independent_of_the_number_of_clients(data: dict[str, np.ndarray]) -> None:
    a, b = _run(data, clients=10), _run(data, clients=100, alpha=0.05)
    assert len(b.client_sizes) == 100 and 0 in b.client_sizes
    _same_outcome(a, b)


def test_projection_keeps_invariance_and_shrinks_the_upload(data: dict[str, np.ndarray]) -> None:
    a = _run(data, ClientJob(NAMES, projection_dim=3, projection_seed=5))
    b = _run(data, ClientJob(NAMES, projection_dim=3, projection_seed=5), clients=37, alpha=0.1)
    _same_outcome(a, b)
    assert a.projection_dim == 3 and a.projection_seed == 5
    assert a.upload_bytes_per_client < _run(data).upload_bytes_per_client


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag"])
def test_upload_bytes_equal_payload_nbytes(data: dict[str, np.ndarray], mode: Mode) -> None:
    heads = {"full": CLOSED, "pooled": ["nb", "lda", "fedcgs"], "gram": ["lda", "ridge"],
             "diag": ["nb"]}[mode]
    result = _run(data, ClientJob(NAMES, mode), server=ServerJob(tuple(heads)))
    expected = payload_nbytes(compute_stats(data["xtr"][:3], data["ytr"][:3], 4, mode))
    assert result.upload_bytes_per_client == expected
    assert result.mode == mode


def test_result_dict_is_the_json_contract(data: dict[str, np.ndarray]) -> None:
    result = _run(data, server=ServerJob(tuple(CLOSED), seed=11), clients=7, alpha=0.3)
    out = json.loads(json.dumps(result.to_dict()))
    assert {"heads", "clients", "alpha", "seed", "mode", "projection_dim",
            "upload_bytes_per_client", "n_train", "n_test", "num_classes", "stage_seconds",
            "client_sizes"} <= set(out)
    assert (out["clients"], out["alpha"], out["seed"], out["mode"]) == (7, 0.3, 11, "full")
    assert out["projection_dim"] is None
    assert (out["n_train"], out["n_test"], out["num_classes"]) == (700, 200, 4)
    assert len(out["client_sizes"]) == 7 and sum(out["client_sizes"]) == 700
    assert list(out["heads"]) == CLOSED
    for name, r in out["heads"].items():
        assert set(r) == {"accuracy", "fit_seconds", "predict_seconds", "params"}
        assert 0.5 < r["accuracy"] <= 1.0
        assert r["fit_seconds"] >= 0 and r["predict_seconds"] >= 0
        assert out["stage_seconds"][f"fit/{name}"] == r["fit_seconds"]
        assert f"evaluate/{name}" in out["stage_seconds"]
    assert out["heads"]["lda"]["params"]["shrinkage"] == "auto"  # the data-driven default
    for stage in ("partition", "client_stats", "client_stats_max", "aggregate"):
        assert out["stage_seconds"][stage] >= 0


def test_head_params_are_applied(data: dict[str, np.ndarray]) -> None:
    result = _run(data, server=ServerJob(("lda",), {"lda": {"shrinkage": "auto"}}))
    assert result.heads["lda"].params["shrinkage"] == "auto"


def test_params_of_heads_not_fitted_are_ignored(data: dict[str, np.ndarray]) -> None:
    """One experiment configuration serves every mode, whose head lists differ."""
    result = _run(data, ClientJob(NAMES, "pooled"), server=ServerJob(
        ("lda",), {"lda": {"shrinkage": 0.1}, "qda": {"shrinkage": 0.2}}))
    assert list(result.heads) == ["lda"]


def test_payloads_go_through_the_plain_protocol(data: dict[str, np.ndarray]) -> None:
    result = _run(data, clients=13)
    agg = result.aggregation
    assert agg["protocol"] == "plain" and agg["survivors"] == 13
    assert list(agg["stages"]) == ["input"]
    assert agg["stages"]["input"]["replies"] == 13
    header = agg["stages"]["input"]["client_sent_bytes_max"] - result.upload_bytes_per_client
    assert 0 < header < 64  # version, round id, stage, sender


def test_dropped_clients_are_left_out_of_the_total(data: dict[str, np.ndarray]) -> None:
    result = _run(data, aggregation=AggregationSpec(drops={"input": 3}), clients=13)
    assert result.aggregation["survivors"] == 10
    assert sorted(result.aggregation["dropped"].values()) == ["input"] * 3


def test_seed_and_progress_reach_heads_that_take_them(
    data: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry._REGISTRY, "seeded", f"{__name__}:SeededHead")
    result = _run(data, server=ServerJob(("nb", "seeded"), seed=42, progress=True))
    assert result.heads["seeded"].params == {"var_smoothing": 1e-9, "seed": 42, "progress": True}
    assert "seed" not in result.heads["nb"].params
    over = _run(data, server=ServerJob(("seeded",), {"seeded": {"seed": 3}}, seed=42))
    assert over.heads["seeded"].params["seed"] == 3


def test_head_needing_a_richer_mode_fails_before_any_work(data: dict[str, np.ndarray]) -> None:
    bad_x = np.full_like(data["xtr"], np.nan)  # would fail later if any work were done
    with pytest.raises(UnsupportedModeError, match=r"head 'qda' needs upload mode 'full' or "
                       r"richer \(full\), but the statistics are mode 'pooled'; .*--mode full"):
        _run({**data, "xtr": bad_x}, ClientJob(NAMES, "pooled"),
             server=ServerJob(("nb", "qda")), clients=5)


def test_unknown_head_and_parameter_are_rejected(data: dict[str, np.ndarray]) -> None:
    with pytest.raises(ConfigError, match=r"unknown head 'svm'; available heads: nb, lda"):
        _run(data, server=ServerJob(("svm",)))
    with pytest.raises(ConfigError, match=r"head 'lda' has no parameter 'foo'; valid "
                       r"parameters: covariance_divisor, shrinkage"):
        _run(data, server=ServerJob(("lda",), {"lda": {"foo": 1}}))
    with pytest.raises(ConfigError, match=r"parameters were given for 'svm', which is not a "
                       r"registered head; available heads: nb, lda"):
        _run(data, server=ServerJob(("lda",), {"svm": {"c": 1.0}}))
    with pytest.raises(ConfigError, match=r"shrinkage must be a number in \[0, 1\] or 'auto'"):
        _run(data, server=ServerJob(("lda",), {"lda": {"shrinkage": 3.0}}))


def test_bad_data_is_named(data: dict[str, np.ndarray]) -> None:
    y = data["ytr"].copy()
    y[5] = 9
    with pytest.raises(InputError, match=r"training label 9 is out of range for 4 classes"):
        _run({**data, "ytr": y}, server=ServerJob(("nb",)), clients=3, alpha=1.0)
    x = data["xtr"].copy()
    x[7, 2] = np.nan
    with pytest.raises(InputError, match=r"training embeddings contain NaN or infinite values "
                       r"\(first bad row 7\)"):
        _run({**data, "xtr": x}, server=ServerJob(("nb",)), clients=3, alpha=1.0)
    with pytest.raises(InputError, match=r"test embeddings have d=5 but training embeddings "
                       r"have d=6"):
        _run({**data, "xte": data["xte"][:, :5]}, server=ServerJob(("nb",)), clients=3,
             alpha=1.0)
    with pytest.raises(ConfigError, match=r"seed must be a non-negative integer; got -1"):
        _run(data, server=ServerJob(tuple(CLOSED), seed=-1))
    with pytest.raises(ConfigError, match=r"mode must be one of full, pooled, gram, diag, means; got 'x'"):
        _run(data, ClientJob(NAMES, "x"))  # type: ignore[arg-type]


def test_build_heads_and_defaults() -> None:
    assert head_defaults("lda") == {"shrinkage": "auto", "covariance_divisor": "n-c"}
    heads = build_heads(["nb", "lda"], {"lda": {"shrinkage": 0.2}}, mode="pooled")
    assert list(heads) == ["nb", "lda"]
    assert heads["lda"].get_params()["shrinkage"] == 0.2


def test_projection_spec_matches_what_clients_use(data: dict[str, np.ndarray]) -> None:
    result = _run(data, ClientJob(NAMES, projection_dim=2, projection_seed=1),
                  server=ServerJob(("nb",)))
    spec = ProjectionSpec(1, 6, 2)
    assert result.upload_bytes_per_client == payload_nbytes(
        compute_stats(data["xtr"][:2], data["ytr"][:2], 4, "full", projection=spec))


def test_secure_simulation_predicts_like_the_plain_one(data: dict[str, np.ndarray]) -> None:
    heads = ["nb", "lda", "qda", "fedcgs", "fishermix", "protohyper"]
    fast = {"fishermix": {"epochs": 3, "n_per_class": 200},
            "protohyper": {"epochs": 3, "n_per_class": 200}}
    job, server = ClientJob(NAMES, clip_norm=20.0), ServerJob(tuple(heads), fast)
    plain = _run(data, job, server=server)
    secure = _run(data, job, AggregationSpec("secure"), server)
    for h in heads:
        np.testing.assert_array_equal(secure.predictions[h], plain.predictions[h])
    assert secure.aggregation["protocol"] == "secure"
    assert secure.clip_norm == plain.clip_norm == 20.0


def test_clipping_without_secure_aggregation_is_recorded(data: dict[str, np.ndarray]) -> None:
    norms = np.linalg.norm(data["xtr"], axis=1)
    bound = float(np.median(norms))
    result = _run(data, ClientJob(NAMES, clip_norm=bound))
    assert result.n_clipped == int(np.sum(norms > bound))
    assert result.to_dict()["clip_norm"] == bound


def test_one_clipping_bound_serves_clipping_and_the_secure_sum() -> None:
    """The plan holds one bound R (``ClientJob.clip_norm``): the clients clip with it and the
    secure sum's fixed-point range is sized by it, so no second bound can disagree; a secure
    plan without one is refused."""
    plan = FederationPlan(ClientJob(NAMES, clip_norm=4), AggregationSpec("secure"), SERVER)
    assert plan.secagg_config().clip_norm == plan.client.clip_norm == 4.0
    assert isinstance(plan.client.clip_norm, float)
    with pytest.raises(ConfigError, match=r"AggregationSpec protocol = \"secure\" needs "
                       r"ClientJob clip_norm: the fixed-point encoding"):
        FederationPlan(JOB, AggregationSpec("secure"), SERVER)
