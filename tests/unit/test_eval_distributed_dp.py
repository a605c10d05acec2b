"""Distributed DP of the federated evaluation: client noise shares, a noisy total only."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, InputError
from ghofl.evaluation.federated import LOG_LOSS_CAP, EvaluationSums, local_evaluation
from ghofl.heads.nb import NBDiagHead
from ghofl.privacy import NOISE_CLAMP_SIGMAS, DPConfig
from ghofl.secure import IdentityKey, Roster, SecAggConfig, SecAggServer, VectorPayload
from ghofl.server import federated_eval
from ghofl.server.eval_privacy import (
    NOISY_EVALUATION_VECTORS,
    charge_evaluation,
    evaluation_noise_share,
    noisy_evaluation_meta,
    release_noisy_total,
)
from ghofl.server.federated_eval import aggregate_evaluation
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server.simulation import Population, simulate
from tests.helpers import gaussian_mixture, numbered

C, BINS, K, T, M, Z = 2, 2, 4, 3, 50, 0.7


@pytest.fixture(scope="module")
def sums() -> dict[str, EvaluationSums]:
    x, y = gaussian_mixture(3, num_classes=C, dim=3, n=200, sep=1.5)
    heads = {"nb": NBDiagHead().fit(x[:100], y[:100], classes=C)}
    parts = np.array_split(np.arange(100, 200), K)
    return {f"c{i}": local_evaluation(heads, x[p], y[p], bins=BINS)
            for i, p in enumerate(parts)}


def _calibrated_sigma(layout: EvaluationSums) -> np.ndarray:
    """σ of every entry (ints then floats) of one head's release, from the sensitivity table."""
    assert len(layout.heads) == 1 and layout.ood_counts is None
    scale = math.sqrt(6 * 1 + 1)  # six blocks of one head and the client count
    ints = [1.0] * (C * C + 2 * BINS) + [1.0]
    floats = [LOG_LOSS_CAP] + [1.0] * BINS + [math.sqrt(2.0)] * 2
    return Z * scale * np.asarray(ints + floats)


def _exact(sums: dict[str, EvaluationSums], keep: list[str]) -> np.ndarray:
    total = sum((sums[c] for c in keep[1:]), sums[keep[0]])
    ints, floats = total.to_vectors()
    return np.concatenate([ints.astype(np.float64), floats])


def test_shares_of_t_clients_carry_the_calibrated_variance(
        sums: dict[str, EvaluationSums]) -> None:
    layout = next(iter(sums.values()))
    meta = noisy_evaluation_meta(layout, M, Z, T)
    sigma = _calibrated_sigma(layout)
    exact = _exact(sums, list(sums)[:T])
    draws = []
    for seed in range(1500):
        rng = np.random.default_rng(seed)
        shares = [evaluation_noise_share(sums[c], meta, Z, T, rng) for c in list(sums)[:T]]
        draws.append((sum(s.floats for s in shares) - exact) / sigma)
    z = np.asarray(draws)
    var = float(np.mean(z ** 2))
    tol = 5 * math.sqrt(2 / z.size)
    assert abs(var - 1.0) < tol, var  # t shares: exactly σ²
    assert np.all(np.abs(np.mean(z, axis=0)) < 5 / math.sqrt(len(draws)))
    one = np.asarray([(evaluation_noise_share(layout, meta, Z, T, np.random.default_rng(s))
                       .floats - _exact(sums, [next(iter(sums))])) / sigma for s in range(1500)])
    assert abs(float(np.mean(one ** 2)) - 1 / T) < 5 * math.sqrt(2 / one.size) / T
    assert np.abs(one).max() <= NOISE_CLAMP_SIGMAS / math.sqrt(T) + 1e-9


def _round(sums: dict[str, EvaluationSums], seed: int, drops: dict[str, int] | None
           ) -> federated_eval.EvaluationRound:
    keys = {c: IdentityKey.generate() for c in sums}
    cfg = SecAggConfig(clip_norm=1.0, threshold=T, max_samples=M, noise_levels=3)
    return aggregate_evaluation(dict(sums), config=cfg, identities=keys,
                                roster=Roster.from_identities(keys), drops=drops, seed=seed,
                                noise_multiplier=Z, noise_seed=seed)


def test_the_server_decodes_only_a_noisy_total_of_calibrated_variance(
        sums: dict[str, EvaluationSums], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[VectorPayload] = []
    decoded = SecAggServer.vector_result

    def spy(self: SecAggServer) -> VectorPayload:
        out = decoded(self)
        seen.append(out)
        return out

    monkeypatch.setattr(SecAggServer, "vector_result", spy)
    layout = next(iter(sums.values()))
    sigma = _calibrated_sigma(layout)
    draws = []
    for seed in range(40):
        rnd = _round(sums, seed, {"mask": 1})  # s = t survivors: exactly σ² kept
        survivors = rnd.aggregation["survivor_ids"]
        assert len(survivors) == T and rnd.release is not None
        total = seen[-1]
        assert total.meta.name == NOISY_EVALUATION_VECTORS and total.meta.n_int == 0
        diff = total.floats - _exact(sums, survivors)
        assert np.all(np.abs(diff) > 1e-9)  # no exact entry ever reaches the server
        draws.append(diff / sigma)
        assert rnd.release.details["kept_variance"] == pytest.approx(1.0)
        assert rnd.release.noise_multiplier == pytest.approx(Z)
    z = np.asarray(draws)
    assert abs(float(np.mean(z ** 2)) - 1.0) < 5 * math.sqrt(2 / z.size)
    full = _round(sums, 99, None)  # all four survive: 4/3 of the calibrated variance
    assert full.release is not None
    assert full.release.details["kept_variance"] == pytest.approx(K / T)
    assert full.release.noise_multiplier == pytest.approx(Z * math.sqrt(K / T))
    ints, floats = full.total.to_vectors()
    assert ints.min() >= 0 and np.all(floats >= 0)  # post-processed into valid sums


def test_charging_a_distributed_release(sums: dict[str, EvaluationSums]) -> None:
    rnd = _round(sums, 5, None)
    assert rnd.release is not None
    charged = charge_evaluation({"epsilon_spent": 1.0, "delta_spent": 1e-5, "delta": 1e-5,
                                 "noise_multiplier": 4.0},
                                rnd.release)
    assert "every client added a share" in charged["evaluation"]["noise"]
    assert charged["evaluation"]["survivors"] == K
    assert 1e-5 <= charged["delta_total"] < 1.0001e-5
    assert charged["epsilon_total"] > 1.0


def test_distributed_shares_are_checked(sums: dict[str, EvaluationSums]) -> None:
    layout = next(iter(sums.values()))
    meta = noisy_evaluation_meta(layout, M, Z, T)
    with pytest.raises(ConfigError, match="distributed DP of the evaluation needs the secure"):
        aggregate_evaluation(dict(sums), noise_multiplier=Z)
    with pytest.raises(ConfigError, match="the noise shares need the round's threshold"):
        noisy_evaluation_meta(layout, M, Z, 0)
    with pytest.raises(ConfigError, match="noise multiplier must be a finite number"):
        noisy_evaluation_meta(layout, M, float("nan"), T)
    other = noisy_evaluation_meta(layout, M, Z, T).__class__(NOISY_EVALUATION_VECTORS, (),
                                                             (1.0,) * 3, nonnegative=False)
    with pytest.raises(ConfigError, match="build the description with noisy_evaluation_meta"):
        evaluation_noise_share(layout, other, Z, T, np.random.default_rng(0))
    small = noisy_evaluation_meta(layout, 1, Z, T)  # M = 1 row: this client holds more
    with pytest.raises(InputError, match="exceed the public per-client bounds"):
        evaluation_noise_share(layout, small, Z, T, np.random.default_rng(0))
    share = evaluation_noise_share(layout, meta, Z, T, np.random.default_rng(0))
    cut = VectorPayload(other, np.zeros(0, np.int64), share.floats[:3])
    params = SecAggConfig(clip_norm=1.0, threshold=T).for_clients(K)
    with pytest.raises(ConfigError, match="give the layout of the round's sums"):
        release_noisy_total(layout, cut, Z, params, K)


def test_simulate_adds_the_evaluation_noise_in_client_shares() -> None:
    x, y = gaussian_mixture(7, num_classes=3, dim=4, n=600, sep=1.2)
    job = ClientJob(numbered(3), clip_norm=20.0)
    agg = AggregationSpec("secure", dp=DPConfig(4.0, mode="distributed"), max_samples=500)
    res = simulate(FederationPlan(job, agg, ServerJob(("nb",))), (x[:450], y[:450]),
                   (x[450:], y[450:]), Population(5, 0.5, eval_fraction=0.25))
    fed: dict[str, Any] = res.federated_evaluation or {}
    priv: dict[str, Any] = res.privacy or {}
    assert "in shares by the clients (distributed DP)" in fed["aggregation"]
    assert "every client added a share" in priv["evaluation"]["noise"]
    assert priv["evaluation"]["survivors"] == 5
    assert priv["epsilon_spent"] < priv["epsilon_total"]
