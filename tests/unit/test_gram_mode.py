"""Upload mode ``gram`` (class counts, class sums and the global Σxxᵀ: Fed3R's upload plus the
class counts) end to
end: its size, its laws, conversions, the file codec, every protocol and privacy setting, the
heads that fit from it exactly as from ``pooled`` statistics of the same data, and the heads
that refuse it with the mode to use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ghofl.client.job import ClientJob
from ghofl.errors import StatsValidationError, UnsupportedModeError
from ghofl.heads import make_head
from ghofl.moments import compute_moments
from ghofl.server.job import ServerJob
from ghofl.server.plan import FederationPlan
from ghofl.server.simulation import Population, simulate
from ghofl.stats import ClientStats, compute_stats, load_stats, save_stats, schema_for, sum_stats
from ghofl.stats.codec import expected_payload_nbytes
from tests.helpers import gaussian_mixture, numbered, protocol_setting

#: Heads that use only N_c, A_c and B (checked identical to their fit from pooled statistics).
GRAM_HEADS = ("lda", "ridge", "fed3r", "fedcgs", "fedcof", "ncm")
FAST = {"fishermix": {"epochs": 2, "n_per_class": 100},
        "protohyper": {"epochs": 2, "n_per_class": 100}}


def _clients(x: np.ndarray, y: np.ndarray, c: int, mode: str, k: int = 5) -> ClientStats:
    parts = np.array_split(np.random.default_rng(4).permutation(len(y)), k)
    return sum_stats(compute_stats(x[p], y[p], c, mode=mode) for p in parts)  # type: ignore[arg-type]


def test_gram_payload_is_counts_sums_and_the_gram_matrix_only() -> None:
    x, y = gaussian_mixture(1, num_classes=4, dim=7, n=300)
    s = compute_stats(x, y, 4, mode="gram")
    assert s.sq_sums is None and s.class_scatter is None and s.scatter is not None
    np.testing.assert_allclose(s.scatter, x.T @ x, rtol=1e-12)
    assert schema_for("gram").nbytes(4, 7) == 8 * (4 + 4 * 7 + 7 * 8 // 2)
    pooled = compute_stats(x, y, 4, mode="pooled")
    assert pooled.to_mode("gram").allclose(s, rtol=1e-12)
    assert s.to_mode("means").allclose(pooled.to_mode("means"), rtol=0.0)
    with pytest.raises(UnsupportedModeError, match=r"mode 'gram' statistics .* --mode pooled"):
        _ = s.diag_sums
    with pytest.raises(UnsupportedModeError, match=r"per-class variances .* mode 'gram'"):
        _ = compute_moments(s).class_vars


@pytest.mark.parametrize(("c", "d", "gram", "pooled"), [
    (10, 1280, 6_661_200, 6_763_600),  # CIFAR-10, EfficientNet-Lite0 features
    (6, 384, 609_840, 628_272),  # TREC, MiniLM features
])
def test_gram_bytes_are_fed3r_upload_plus_counts(c: int, d: int, gram: int, pooled: int
                                                  ) -> None:
    fed3r = 8 * (c * d + d * (d + 1) // 2)  # Fed3R: the C·d class sums and the Gram triangle
    assert expected_payload_nbytes("gram", c, d) == gram == fed3r + 8 * c  # + the counts
    assert expected_payload_nbytes("pooled", c, d) == pooled == gram + 8 * c * d
    assert expected_payload_nbytes("gram", c, d, transport_dtype="float32") == 8 * c + (
        gram - 8 * c) // 2


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_file_round_trip(tmp_path: Path, dtype: str) -> None:
    x, y = gaussian_mixture(2, num_classes=3, dim=5, n=120)
    s = compute_stats(x, y, ("a", "b", "c"), mode="gram", clip_norm=4.0)
    save_stats(s, tmp_path / "g.ghs", transport_dtype=dtype)
    back = load_stats(tmp_path / "g.ghs")
    assert back.mode == "gram" and back.sq_sums is None
    assert back.allclose(s, rtol=0.0 if dtype == "float64" else 1e-6)
    assert back.n_clipped == s.n_clipped


def test_gram_laws_refuse_corrupt_payloads() -> None:
    x, y = gaussian_mixture(3, num_classes=3, dim=4, n=90)
    s = compute_stats(x, y, 3, mode="gram")
    arrays = {"counts": s.counts.copy(), "sums": s.sums.copy(), "scatter": s.scatter.copy()}  # type: ignore[union-attr]
    bad = {**arrays, "scatter": arrays["scatter"] - 10.0 * np.eye(4) * arrays["scatter"].max()}
    with pytest.raises(StatsValidationError, match=r"non-negative|positive semi-definite"):
        ClientStats(s.meta, **bad)
    small = {**arrays, "scatter": arrays["scatter"] * 1e-6}  # B far below Σ_c A_c A_cᵀ/N_c
    with pytest.raises(StatsValidationError, match="positive semi-definite"):
        ClientStats(s.meta, **small)
    empty = {"counts": np.zeros(3, np.int64), "sums": np.zeros((3, 4)),
             "scatter": np.eye(4)}
    with pytest.raises(StatsValidationError, match="no sample but a non-zero B"):
        ClientStats(s.meta, **empty)
    with pytest.raises(StatsValidationError, match="must not hold sq_sums"):
        ClientStats(s.meta, sq_sums=np.ones((3, 4)), **arrays)


def test_subtraction_of_a_part_and_of_a_stranger() -> None:
    x, y = gaussian_mixture(5, num_classes=3, dim=4, n=200)
    a = compute_stats(x[:120], y[:120], 3, mode="gram")
    b = compute_stats(x[120:], y[120:], 3, mode="gram")
    assert ((a + b) - b).allclose(a, rtol=1e-9)
    zero = (a + b) - a - b
    assert zero.n_samples == 0 and not np.any(zero.scatter)
    stranger = compute_stats(x[:120] * 3.0, y[:120], 3, mode="gram")
    with pytest.raises(StatsValidationError):
        _ = (a + b) - stranger - b


@pytest.mark.parametrize("head", [*GRAM_HEADS, "fishermix", "protohyper"])
def test_heads_from_gram_equal_the_heads_from_pooled(head: str) -> None:
    x, y = gaussian_mixture(6, num_classes=4, dim=8, n=400, sep=1.5)
    test = np.random.default_rng(2).normal(scale=2.0, size=(200, 8))
    gram, pooled = _clients(x, y, 4, "gram"), _clients(x, y, 4, "pooled")
    params = FAST.get(head, {})
    hg = make_head(head, **params).fit_from_stats(gram)
    hp = make_head(head, **params).fit_from_stats(pooled)
    np.testing.assert_array_equal(hg.predict_proba(test), hp.predict_proba(test))
    np.testing.assert_array_equal(hg.predict(x), hp.predict(x))


@pytest.mark.parametrize(("head", "use"), [("nb", "diag"), ("qda", "full")])
def test_heads_needing_per_class_moments_refuse_gram(head: str, use: str) -> None:
    x, y = gaussian_mixture(2, num_classes=3, dim=4, n=200)
    with pytest.raises(UnsupportedModeError,
                       match=rf"head '{head}' needs upload mode '{use}' or richer .*mode "
                       rf"'gram'\. Recompute the client statistics with --mode {use}"):
        make_head(head).fit_from_stats(compute_stats(x, y, 3, mode="gram"))


@pytest.mark.parametrize("setting", ["plain", "secure", "central-dp", "distributed-dp"])
def test_every_protocol_carries_the_gram_mode(setting: str) -> None:
    x, y = gaussian_mixture(3, num_classes=3, dim=6, n=900, sep=3.0)
    clip, agg = protocol_setting(setting)
    accs: dict[str, dict[str, float]] = {}
    for mode in ("gram", "pooled"):
        plan = FederationPlan(ClientJob(numbered(3), mode, clip_norm=clip), agg,  # type: ignore[arg-type]
                              ServerJob(("lda", "ridge"), seed=0))
        res = simulate(plan, (x, y), (x, y), Population(5, 0.5))
        assert res.mode == mode
        accs[mode] = {h: res.heads[h].accuracy for h in ("lda", "ridge")}
        if mode == "gram":
            assert res.upload_bytes_per_client == expected_payload_nbytes("gram", 3, 6)
    for h in ("lda", "ridge"):
        if setting in ("plain", "secure"):  # exact sums: the same heads as from pooled
            assert accs["gram"][h] == accs["pooled"][h]
        else:  # a valid release (3 blocks noised: counts, sums, B), heads far above chance
            assert accs["gram"][h] > 0.5


def test_fedcof_estimate_converts_to_gram_with_its_degrees_of_freedom() -> None:
    from ghofl.moments.fedcof import fedcof_statistics

    x, y = gaussian_mixture(7, num_classes=3, dim=5, n=600, sep=1.5)
    parts = np.array_split(np.random.default_rng(3).permutation(len(y)), 12)
    est = fedcof_statistics([compute_stats(x[p], y[p], 3, mode="means") for p in parts])
    gram = est.to_mode("gram")
    assert gram.mode == "gram" and compute_moments(gram).is_estimated
    assert compute_moments(gram).pooled_dof() == compute_moments(est).pooled_dof()
    for head in ("lda", "ridge"):
        np.testing.assert_array_equal(make_head(head).fit_from_stats(gram).predict_proba(x),
                                      make_head(head).fit_from_stats(est).predict_proba(x))
