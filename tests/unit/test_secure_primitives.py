"""Building blocks of the secure sum: Shamir sharing, the SecAgg+ graph, the mask PRG, the
fixed-point codec."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.errors import ConfigError, InputError
from ghofl.secure import primitives as cr
from ghofl.secure import shamir
from ghofl.secure.fixedpoint import FixedPointCodec
from ghofl.secure.graph import default_neighbours, harary_neighbours
from ghofl.secure.graph_params import meets_targets, required_parameters, share_threshold_for
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import sum_stats
from ghofl.stats.projection import ProjectionSpec
from tests.helpers import gaussian_mixture


# ---------------------------------------------------------------------- Shamir
@pytest.mark.parametrize(("n", "t"), [(2, 2), (5, 3), (9, 5), (12, 12)])
def test_shamir_any_t_shares_reconstruct(n: int, t: int) -> None:
    secret = cr.random_seed()
    xs = list(range(1, n + 1))
    shares = shamir.share_secret(secret, xs, t)
    for subset in itertools.islice(itertools.combinations(zip(xs, shares, strict=True), t), 20):
        assert shamir.reconstruct(subset, t) == secret


def test_shamir_fewer_than_t_shares_give_nothing() -> None:
    secret = cr.random_seed()
    shares = shamir.share_secret(secret, [1, 2, 3, 4, 5], 3)
    assert shamir.reconstruct([(1, shares[0]), (2, shares[1])], 3) is None
    # t-1 shares interpolated as if the threshold were t-1 give an unrelated value
    assert shamir.reconstruct([(1, shares[0]), (2, shares[1])], 2) != secret


def test_shamir_tampered_share_is_detected_or_wrong() -> None:
    secret = cr.random_seed()
    shares = shamir.share_secret(secret, [1, 2, 3], 3)
    bad = bytearray(shares[1])
    bad[-1] ^= 1
    assert shamir.reconstruct([(1, shares[0]), (2, bytes(bad)), (3, shares[2])], 3) != secret


def test_shamir_shares_are_fresh_each_time() -> None:
    secret = cr.random_seed()
    assert shamir.share_secret(secret, [1, 2], 2) != shamir.share_secret(secret, [1, 2], 2)


@pytest.mark.parametrize(
    ("secret", "xs", "t", "match"),
    [
        (b"short", [1, 2], 2, "Shamir secrets must be 32 bytes; got 5"),
        (bytes(32), [1, 2], 3, r"threshold must be between 1 and the number of holders \(2\)"),
        (bytes(32), [1, 1], 2, "evaluation points must be distinct integers >= 1"),
        (bytes(32), [0, 1], 2, "evaluation points must be distinct integers >= 1"),
    ],
)
def test_shamir_rejects_bad_arguments(secret: bytes, xs: list[int], t: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        shamir.share_secret(secret, xs, t)


# ---------------------------------------------------------------------- graph
@pytest.mark.parametrize(("n", "k"), [(10, 4), (31, 8), (100, 20), (7, 3)])
def test_harary_graph_is_symmetric_regular_and_public(n: int, k: int) -> None:
    g = harary_neighbours(n, k, b"round-a")
    even_k = k + (k % 2)
    for i, nb in enumerate(g):
        assert i not in nb
        assert len(nb) == even_k
        assert all(i in g[j] for j in nb)
    assert g == harary_neighbours(n, k, b"round-a")
    assert g != harary_neighbours(n, k, b"round-b")


def test_harary_graph_is_complete_when_k_reaches_n_minus_1() -> None:
    g = harary_neighbours(6, 5, b"r")
    assert all(nb == frozenset(set(range(6)) - {i}) for i, nb in enumerate(g))


@pytest.mark.parametrize("n", [2, 10, 14, 30, 100, 1000])
def test_default_neighbours_are_sized_by_the_targets(n: int) -> None:
    k = default_neighbours(n)
    assert k == required_parameters(n)[0] <= n - 1
    if k < n - 1:  # a sparse graph: the next smaller even degree misses a target
        t_s = share_threshold_for(n, k - 2)
        assert not meets_targets(n, k - 2, t_s, 1 / 3, 1 / 3, 40, 20)


# ---------------------------------------------------------------------- primitives
def test_mask_words_are_deterministic_per_seed_and_differ_across_seeds() -> None:
    a, b = cr.random_seed(), cr.random_seed()
    assert np.array_equal(cr.mask_words(a, 1000), cr.mask_words(a, 1000))
    assert not np.array_equal(cr.mask_words(a, 1000), cr.mask_words(b, 1000))
    long = cr.mask_words(a, (1 << 20) + 3)  # several keystream blocks
    assert np.array_equal(long[:1000], cr.mask_words(a, 1000))


def test_mask_words_look_uniform() -> None:
    words = cr.mask_words(cr.random_seed(), 1 << 16)
    bits = np.unpackbits(words.view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.005
    top = np.bincount((words >> np.uint64(56)).astype(np.int64), minlength=256)
    chi2 = float(((top - words.size / 256) ** 2 / (words.size / 256)).sum())
    assert chi2 < 400  # 255 degrees of freedom; p < 1e-6 above ~ 370


def test_aead_detects_tampering_and_wrong_keys() -> None:
    key = cr.derive_key(cr.random_seed(), b"share", b"round")
    box = cr.aead_encrypt(key, b"secret", b"aad")
    assert cr.aead_decrypt(key, box, b"aad") == b"secret"
    assert cr.aead_decrypt(key, box, b"other aad") is None
    assert cr.aead_decrypt(cr.random_seed(), box, b"aad") is None
    flipped = bytearray(box)
    flipped[20] ^= 1
    assert cr.aead_decrypt(key, bytes(flipped), b"aad") is None
    assert cr.aead_decrypt(key, b"short", b"aad") is None


def test_key_agreement_is_symmetric_and_keys_bind_purpose_and_round() -> None:
    a, b = cr.KeyPair.generate(), cr.KeyPair.generate()
    shared = cr.agree(a.private, b.public)
    assert shared == cr.agree(b.private, a.public)
    assert cr.public_from_private(a.private) == a.public
    k = cr.derive_key(shared, b"mask", b"r1")
    assert k != cr.derive_key(shared, b"share", b"r1")
    assert k != cr.derive_key(shared, b"mask", b"r2")


def test_pair_keys_bind_the_session_and_the_ordered_pair() -> None:
    """A share box's key (what a complaint reveals) serves one sender → recipient box of one
    session only: not the reverse box, not another pair, not another run; its commitment and
    a nonce commitment bind everything they name."""
    from ghofl.secure._common import key_commitment, nonce_commitment, pair_key

    a, b = cr.KeyPair.generate(), cr.KeyPair.generate()
    shared = cr.agree(a.private, b.public)
    key = pair_key(shared, b"session-1", "a", "b")
    assert key == pair_key(cr.agree(b.private, a.public), b"session-1", "a", "b")
    others = {pair_key(shared, b"session-1", "b", "a"), pair_key(shared, b"session-2", "a", "b"),
              pair_key(shared, b"session-1", "a", "c"), pair_key(shared, b"session-1", "ab", ""),
              cr.derive_key(shared, b"share", b"session-1"), shared}
    assert key not in others and len(others) == 6 and len(key) == cr.KEY_BYTES
    c = key_commitment(b"session-1", "a", "b", key)
    assert len(c) == 32 and c not in {key_commitment(b"session-2", "a", "b", key),
                                      key_commitment(b"session-1", "b", "a", key),
                                      key_commitment(b"session-1", "a", "b", bytes(32))}
    n = nonce_commitment(b"round-id-0000001", "a", b"nonce")
    assert n != nonce_commitment(b"round-id-0000002", "a", b"nonce")
    assert n != nonce_commitment(b"round-id-0000001", "b", b"nonce")
    assert n != nonce_commitment(b"round-id-0000001", "a", b"nonce!")


# ---------------------------------------------------------------------- fixed point
def _clients(mode: str, n: int, seed: int, *, projection: ProjectionSpec | None = None,
             clip: float = 6.0, dim: int = 8, classes: int = 4):  # type: ignore[no-untyped-def]
    out = []
    for i in range(n):
        x, y = gaussian_mixture(seed + i, classes, dim, n=150)
        out.append(compute_stats(x, y, classes, mode, projection=projection,  # type: ignore[arg-type]
                                 clip_norm=clip))
    return out


def _modular_sum(words: list[np.ndarray]) -> np.ndarray:
    total = np.zeros_like(words[0])
    for w in words:
        total += w
    return total


def _max_rel_error(a, b) -> float:  # type: ignore[no-untyped-def]
    worst = 0.0
    for name, x in a.arrays().items():
        y = b.arrays()[name]
        if x is None or name == "counts":
            continue
        worst = max(worst, float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-300)))
    return worst


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag"])
@pytest.mark.parametrize("limbs", [1, 2])
@pytest.mark.parametrize("projected", [False, True])
def test_fixed_point_sum_matches_the_float_sum(mode: str, limbs: int, projected: bool) -> None:
    proj = ProjectionSpec(3, 8, 5) if projected else None
    parts = _clients(mode, 7, 11, projection=proj)
    codec = FixedPointCodec(7, 10_000, 6.0, limbs)
    total = codec.decode(parts[0].meta, _modular_sum([codec.encode(p) for p in parts]))
    plain = sum_stats(parts)
    assert np.array_equal(total.counts, plain.counts)
    assert total.n_clipped == plain.n_clipped
    assert _max_rel_error(total, plain) <= (1e-12 if limbs == 2 else 1e-6)
    for seg in ("first", "second"):
        bound = codec.error_bound(seg)  # type: ignore[arg-type]
        assert bound > 0
    if limbs == 2:
        assert codec.error_bound("second") < 1e-20 * codec.bound("second")


def test_fixed_point_error_stays_within_its_bound() -> None:
    parts = _clients("pooled", 5, 3)
    codec = FixedPointCodec(5, 1_000, 6.0, limbs=1)
    total = codec.decode(parts[0].meta, _modular_sum([codec.encode(p) for p in parts]))
    plain = sum_stats(parts)
    assert plain.scatter is not None and total.scatter is not None
    err = float(np.max(np.abs(total.scatter - plain.scatter)))
    assert err <= codec.error_bound("second") + 1e-12 * float(np.max(np.abs(plain.scatter)))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 9), seed=st.integers(0, 10_000),
       mode=st.sampled_from(["full", "pooled", "gram", "diag"]))
def test_fixed_point_round_trip_property(n: int, seed: int, mode: str) -> None:
    parts = _clients(mode, n, seed, dim=4, classes=3)
    codec = FixedPointCodec(n, 500, 6.0)
    total = codec.decode(parts[0].meta, _modular_sum([codec.encode(p) for p in parts]))
    plain = sum_stats(parts)
    assert np.array_equal(total.counts, plain.counts)
    assert _max_rel_error(total, plain) <= 1e-12


def test_fixed_point_is_exact_at_the_extreme_bound() -> None:
    """Every client at the public bounds (M samples of norm R, all in one class): no wrap."""
    n, m, r = 50, 64, 3.0
    x = np.full((m, 4), r / 2.0)  # norm exactly R
    y = np.zeros(m, np.int64)
    parts = [compute_stats(x, y, 2, "full", clip_norm=r)] * n
    codec = FixedPointCodec(n, m, r)
    total = codec.decode(parts[0].meta, _modular_sum([codec.encode(p) for p in parts]))
    plain = sum_stats(parts)
    assert _max_rel_error(total, plain) <= 1e-15
    assert int(total.counts[0]) == n * m


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_clients": 0, "max_samples": 5, "clip_norm": 1.0}, "num_clients must be >= 1; got 0"),
        ({"num_clients": 2, "max_samples": 0, "clip_norm": 1.0}, "max_samples must be >= 1; got 0"),
        ({"num_clients": 2, "max_samples": 5, "clip_norm": 0.0},
         r"clipping bound R must be a finite number > 0; got 0.0"),
        ({"num_clients": 2, "max_samples": 5, "clip_norm": float("inf")},
         r"clipping bound R must be a finite number > 0; got inf"),
        ({"num_clients": 2, "max_samples": 5, "clip_norm": 1.0, "limbs": 3},
         "limbs must be 1 or 2; got 3"),
        ({"num_clients": 2**40, "max_samples": 2**30, "clip_norm": 1.0},
         "does not fit in 62 bits, so counts could wrap; lower max_samples"),
    ],
)
def test_fixed_point_rejects_bad_parameters(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        FixedPointCodec(**kwargs)  # type: ignore[arg-type]


def test_fixed_point_refuses_statistics_beyond_the_public_bounds() -> None:
    x, y = gaussian_mixture(0, 3, 4, n=40)
    codec = FixedPointCodec(3, 1000, 6.0)
    with pytest.raises(InputError, match=r"public clipping bound R=6 but these statistics were "
                       r"computed with no clipping; recompute them with --clip 6"):
        codec.encode(compute_stats(x, y, 3, "full"))
    with pytest.raises(InputError, match=r"computed with R=5; recompute them with --clip 6"):
        codec.encode(compute_stats(x, y, 3, "full", clip_norm=5.0))
    with pytest.raises(InputError, match=r"this client holds more samples than the public "
                       r"maximum M=10 per client"):
        FixedPointCodec(3, 10, 6.0).encode(compute_stats(x, y, 3, "full", clip_norm=6.0))
    with pytest.raises(InputError, match=r"the aggregated vector must be uint64 of length"):
        codec.decode(compute_stats(x, y, 3, "full", clip_norm=6.0).meta, np.zeros(3, np.uint64))


def test_fixed_point_refuses_values_that_clipping_cannot_produce() -> None:
    x, y = gaussian_mixture(0, 3, 4, n=40)
    s = compute_stats(x * 100.0, y, 3, "diag")  # unclipped, then relabelled as clipped
    from dataclasses import replace

    from ghofl.stats.client_stats import ClientStats
    forged = ClientStats(replace(s.meta, clip_norm=1.0), s.counts, s.sums, sq_sums=s.sq_sums)
    with pytest.raises(InputError, match=r"these statistics are not what clipping at R=1 .* "
                       r"first moment \(class '0'\); .* recompute "
                       r"them from the embeddings with clipping at R=1"):
        FixedPointCodec(3, 1000, 1.0).encode(forged)
