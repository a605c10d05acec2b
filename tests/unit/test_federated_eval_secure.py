"""Federated evaluation sums through the statistics round's protocol, and their DP release."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, InputError
from ghofl.evaluation.federated import (
    EvaluationSums,
    local_evaluation,
    report,
)
from ghofl.heads.lda import LDAHead
from ghofl.heads.nb import NBDiagHead
from ghofl.privacy import DPConfig, gaussian_epsilon
from ghofl.secure import IdentityKey, Roster, SecAggConfig
from ghofl.server.eval_privacy import (
    charge_evaluation,
    composed_epsilon,
    evaluation_sensitivity,
    release_evaluation,
)
from ghofl.server.federated_eval import aggregate_evaluation, evaluation_meta
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server.simulation import Population, simulate
from tests.helpers import gaussian_mixture, numbered

C, D, K = 3, 4, 6


@pytest.fixture(scope="module")
def client_sums() -> dict[str, EvaluationSums]:
    x, y = gaussian_mixture(5, num_classes=C, dim=D, n=600, sep=1.0)
    heads = {"nb": NBDiagHead().fit(x[:300], y[:300], classes=C),
             "lda": LDAHead().fit(x[:300], y[:300], classes=C)}
    parts = np.array_split(np.arange(300, 600), K)
    return {f"c{i}": local_evaluation(heads, x[p], y[p]) for i, p in enumerate(parts)}


def _secure(sums: dict[str, EvaluationSums | None], drops: dict[str, int] | None = None
            ) -> tuple[EvaluationSums, dict[str, object]]:
    keys = {c: IdentityKey.generate() for c in sums}
    cfg = SecAggConfig(clip_norm=1.0, max_samples=1000)
    out = aggregate_evaluation(sums, config=cfg, identities=keys,
                               roster=Roster.from_identities(keys), drops=drops, seed=1)
    return out.total, out.aggregation


def _assert_equal_sums(a: EvaluationSums, b: EvaluationSums) -> None:
    ai, af = a.to_vectors()
    bi, bf = b.to_vectors()
    np.testing.assert_array_equal(ai, bi)
    np.testing.assert_allclose(af, bf, rtol=1e-12, atol=1e-12)


def test_the_secure_total_equals_the_clear_sum(client_sums: dict[str, EvaluationSums]) -> None:
    total, agg = _secure(dict(client_sums))
    _assert_equal_sums(total, sum(client_sums.values()))  # type: ignore[arg-type]
    assert agg["protocol"] == "secure" and agg["survivors"] == K and total.clients == K
    plain = aggregate_evaluation(dict(client_sums))
    _assert_equal_sums(plain.total, total)
    assert plain.aggregation["protocol"] == "plain"


def test_a_client_dropping_after_the_key_exchange_is_tolerated(
        client_sums: dict[str, EvaluationSums]) -> None:
    total, agg = _secure(dict(client_sums), drops={"mask": 1})
    (gone,) = agg["dropped"]  # type: ignore[misc]
    assert agg["dropped"][gone] == "mask"  # type: ignore[index]
    _assert_equal_sums(total, sum(s for c, s in client_sums.items() if c != gone))  # type: ignore[arg-type]
    assert total.clients == K - 1


def test_a_client_without_held_out_rows_sends_zeros(
        client_sums: dict[str, EvaluationSums]) -> None:
    sums: dict[str, EvaluationSums | None] = {**client_sums, "c0": None}
    total, _ = _secure(sums)
    _assert_equal_sums(total, sum(s for c, s in client_sums.items() if c != "c0"))  # type: ignore[arg-type]
    with pytest.raises(InputError, match="no client holds a held-out row"):
        aggregate_evaluation(dict.fromkeys(client_sums))


def test_a_client_over_the_public_bounds_is_refused(
        client_sums: dict[str, EvaluationSums]) -> None:
    big = client_sums["c1"]
    head = big.heads["nb"]
    bad = dataclasses.replace(big, clients=2)  # one client claiming two
    assert bad.heads["nb"] is head
    sums: dict[str, EvaluationSums | None] = {**client_sums, "c1": bad}
    total, agg = _secure(sums)
    assert "c1" not in agg["survivor_ids"]  # type: ignore[operator]
    assert "cannot take part: the 'evaluation' vectors exceed the public per-client bounds" \
        in agg["refused"]["c1"]  # type: ignore[index]
    _assert_equal_sums(total, sum(s for c, s in client_sums.items() if c != "c1"))  # type: ignore[arg-type]
    plain = aggregate_evaluation(sums)
    assert "integer entry" in plain.aggregation["refused"]["c1"]
    meta = evaluation_meta(big, 1000)
    assert meta.name == "evaluation" and meta.n_int == big.to_vectors()[0].size


def test_the_dp_release_is_valid_noisy_and_calibrated(
        client_sums: dict[str, EvaluationSums]) -> None:
    total: EvaluationSums = sum(client_sums.values())  # type: ignore[assignment]
    sens, scale = evaluation_sensitivity(total)
    assert scale == pytest.approx(math.sqrt(6 * 2 + 1 + (total.ood_counts is not None)))
    assert sens["log_loss_sum"] == pytest.approx(-math.log(np.finfo(float).eps))
    rel = release_evaluation(total, 2.0, np.random.default_rng(0))
    assert rel.sigma["confusion"] == pytest.approx(2.0 * scale)
    assert rel.sigma["log_loss_sum"] == pytest.approx(2.0 * scale * sens["log_loss_sum"])
    noisy = rel.sums  # a valid EvaluationSums (its constructor checked consistency)
    assert noisy.to_vectors()[0].shape == total.to_vectors()[0].shape
    assert not np.array_equal(noisy.to_vectors()[0], total.to_vectors()[0])
    exact, got = report(total)["lda"], report(noisy)["lda"]
    assert abs(got["accuracy"] - exact["accuracy"]) < 0.2
    with pytest.raises(ConfigError, match="noise multiplier must be a finite number > 0"):
        release_evaluation(total, 0.0, np.random.default_rng(0))


def test_a_layout_of_unknown_sensitivity_is_refused(
        client_sums: dict[str, EvaluationSums]) -> None:
    total = client_sums["c0"]
    odd = dataclasses.replace(total, bins=total.bins)
    object.__setattr__(odd, "to_vectors", lambda: (np.zeros(3, np.int64), np.zeros(2)))
    with pytest.raises(ConfigError, match="whose sensitivity the DP evaluation release knows"):
        evaluation_sensitivity(odd)


def test_composition_charges_fit_and_evaluation() -> None:
    one = gaussian_epsilon(1.5, 1e-5)
    two = composed_epsilon([1.5, 1.5], 1e-5)
    assert one < two < 2 * one
    assert composed_epsilon([1.5], 1e-5) == pytest.approx(one, rel=1e-6)
    with pytest.raises(ConfigError, match="composition needs one or more finite noise"):
        composed_epsilon([], 1e-5)
    with pytest.raises(ConfigError, match="strictly between 0 and 1"):
        composed_epsilon([1.0], 2.0)


def test_simulate_sends_the_evaluation_sums_securely() -> None:
    x, y = gaussian_mixture(7, num_classes=4, dim=5, n=800, sep=1.2)
    job = ClientJob(numbered(4), clip_norm=20.0)

    def run(agg: AggregationSpec) -> dict[str, object]:
        plan = FederationPlan(job, agg, ServerJob(("nb", "lda")))
        res = simulate(plan, (x[:600], y[:600]), (x[600:], y[600:]),
                       Population(8, 0.5, eval_fraction=0.25))
        assert res.federated_evaluation is not None
        return {"fed": res.federated_evaluation, "privacy": res.privacy}

    plain, secure = run(AggregationSpec()), run(AggregationSpec("secure"))
    fp, fs = plain["fed"], secure["fed"]
    assert fs["protocol"]["protocol"] == "secure" and fp["protocol"]["protocol"] == "plain"  # type: ignore[index]
    assert fs["aggregation"].startswith("secure aggregation: 8 of 8")  # type: ignore[index]
    for head in ("nb", "lda"):
        for k, v in fp["heads"][head].items():  # type: ignore[index]
            assert fs["heads"][head][k] == pytest.approx(v, rel=1e-12, abs=1e-12), k  # type: ignore[index]
    dropped = run(AggregationSpec("secure", drops={"mask": 1}))["fed"]
    assert dropped["protocol"]["survivors"] == 7 and dropped["clients"] == 7  # type: ignore[index]
    dp = run(AggregationSpec(dp=DPConfig(2.0)))
    priv = dp["privacy"]
    assert priv["epsilon_spent"] < priv["epsilon_total"] < 2 * priv["epsilon_spent"] + 1e-3  # type: ignore[index]
    assert priv["evaluation"]["noise_multiplier"] > 0  # type: ignore[index]
    assert "noise added by the server" in dp["fed"]["aggregation"]  # type: ignore[index]
    charged = charge_evaluation({"epsilon_spent": 2.0, "delta_spent": 2e-5, "delta": 1e-5,
                                 "noise_multiplier": 2.5},
                                release_evaluation(_tiny(), 1.0, np.random.default_rng(1)))
    assert charged["delta_total"] == pytest.approx(2e-5)


def _tiny() -> EvaluationSums:
    x, y = gaussian_mixture(1, num_classes=2, dim=2, n=40, sep=2.0)
    return local_evaluation({"nb": NBDiagHead().fit(x, y, classes=2)}, x, y)
