"""Shamir threshold secret sharing of 32-byte secrets over the prime field GF(2^521 − 1).

A secret s (a 256-bit integer) becomes the constant term of a random polynomial f of degree
t − 1 with coefficients drawn from the operating system's CSPRNG; holder i receives the point
(x_i, f(x_i)) with x_i ≥ 1 distinct. Any t points give s back by Lagrange interpolation at 0;
fewer than t reveal nothing about s (information-theoretic). The field is the Mersenne prime
2^521 − 1, larger than every 256-bit secret, so no secret is ever reduced.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from ghofl.errors import ConfigError

__all__ = ["PRIME", "SHARE_BYTES", "lagrange_weights", "reconstruct", "reconstruct_with",
           "share_secret"]

#: The field modulus, the Mersenne prime 2^521 − 1.
PRIME = (1 << 521) - 1
#: Bytes of one share value (big-endian).
SHARE_BYTES = 66
_SECRET_BYTES = 32


def share_secret(secret: bytes, xs: Sequence[int], threshold: int) -> list[bytes]:
    """Split ``secret`` into one share per evaluation point in ``xs``.

    Parameters
    ----------
    secret : bytes
        Exactly 32 bytes.
    xs : sequence of int
        Distinct evaluation points in ``1 .. PRIME − 1`` (one per holder).
    threshold : int
        Number of shares needed to reconstruct (1 ≤ threshold ≤ len(xs)).

    Returns
    -------
    list of bytes
        ``SHARE_BYTES`` bytes per point, in the order of ``xs``.
    """
    if len(secret) != _SECRET_BYTES:
        raise ConfigError(f"Shamir secrets must be {_SECRET_BYTES} bytes; got {len(secret)}")
    if not 1 <= threshold <= len(xs):
        raise ConfigError(
            f"Shamir threshold must be between 1 and the number of holders ({len(xs)}); "
            f"got {threshold}"
        )
    if len(set(xs)) != len(xs) or min(xs) < 1:
        raise ConfigError("Shamir evaluation points must be distinct integers >= 1")
    coeffs = [int.from_bytes(secret, "big")] + [
        secrets.randbelow(PRIME) for _ in range(threshold - 1)
    ]
    out = []
    for x in xs:
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        out.append(y.to_bytes(SHARE_BYTES, "big"))
    return out


def reconstruct(points: Sequence[tuple[int, bytes]], threshold: int) -> bytes | None:
    """Lagrange interpolation at 0 from the first ``threshold`` points.

    Parameters
    ----------
    points : sequence of (int, bytes)
        Evaluation point and share value, as produced by :func:`share_secret`.
    threshold : int
        Degree + 1 of the sharing polynomial.

    Returns
    -------
    bytes or None
        The 32-byte secret, or ``None`` when there are too few points, points repeat, a share
        is malformed, or the interpolated value is not a 256-bit secret (inconsistent shares).
    """
    pts = list(points)[:threshold]
    if len(pts) < threshold or len({x for x, _ in pts}) != len(pts):
        return None
    if any(len(y) != SHARE_BYTES for _, y in pts):
        return None
    return _combine(lagrange_weights([x for x, _ in pts]), [y for _, y in pts])


def lagrange_weights(xs: Sequence[int]) -> list[int]:
    """The weights w_i with f(0) = Σ_i w_i·f(x_i) mod PRIME, for distinct points ``xs``.

    Computed once, they reconstruct every secret shared over the same points
    (:func:`reconstruct_with`).
    """
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return out


def reconstruct_with(weights: Sequence[int], shares: Sequence[bytes]) -> bytes | None:
    """:func:`reconstruct` given the points' :func:`lagrange_weights` and their share values."""
    if len(shares) != len(weights) or any(len(y) != SHARE_BYTES for y in shares):
        return None
    return _combine(weights, shares)


def _combine(weights: Sequence[int], shares: Sequence[bytes]) -> bytes | None:
    ys = [int.from_bytes(y, "big") for y in shares]
    if any(y >= PRIME for y in ys):
        return None
    secret = sum(w * y for w, y in zip(weights, ys, strict=True)) % PRIME
    if secret >> (8 * _SECRET_BYTES):
        return None
    return secret.to_bytes(_SECRET_BYTES, "big")
