"""Public seeded random projection z = x R that every client rebuilds bit-identically.

The generator is documented so any implementation can rebuild R exactly:

* bits: ``numpy.random.PCG64(seed)`` (seeded through ``numpy.random.SeedSequence``), whose
  64-bit output stream ``random_raw`` numpy keeps stable across versions and platforms (NEP 19);
* entries: R has shape (d, k) filled in row-major order; entry ``i`` of that order takes bit
  ``i % 64`` (least significant first) of raw word ``i // 64``; bit 1 gives ``-1/sqrt(k)`` and
  bit 0 gives ``+1/sqrt(k)``.

This is the Rademacher (Achlioptas) Johnson–Lindenstrauss projection: E[R Rᵀ] = (1) I_d up to the
1/sqrt(k) scaling, so E‖xR‖² = ‖x‖². It uses no floating-point transcendental function, so the
matrix is bit-identical on every machine, unlike Gaussian draws whose tails go through libm.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, StatsFormatError

GENERATOR = "pcg64-rademacher-v1"


@dataclass(frozen=True)
class ProjectionSpec:
    """A public random projection R ∈ R^{input_dim × dim}.

    Parameters
    ----------
    seed : int
        Public seed, agreed by all clients (non-negative).
    input_dim : int
        Encoder dimension d.
    dim : int
        Projected dimension k (1 <= k).
    generator : str
        Name of the documented generator (see module docstring).
    """

    seed: int
    input_dim: int
    dim: int
    generator: str = GENERATOR

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ConfigError(f"projection seed must be a non-negative integer; got {self.seed}")
        if self.input_dim < 1 or self.dim < 1:
            raise ConfigError(
                f"projection dims must be >= 1; got input_dim={self.input_dim}, dim={self.dim}"
            )
        if self.generator != GENERATOR:
            raise ConfigError(
                f"unknown projection generator {self.generator!r}; "
                f"this ghofl supports {GENERATOR!r}"
            )

    def matrix(self) -> NDArray[np.float64]:
        """Return R, shape (input_dim, dim), float64, read-only and cached."""
        return _rademacher(self.seed, self.input_dim, self.dim)

    def apply(self, x: NDArray[Any]) -> NDArray[np.float64]:
        """Project embeddings ``x`` of shape (n, input_dim) to (n, dim) in float64."""
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            raise ConfigError(
                f"projection expects embeddings of shape (n, {self.input_dim}); got {x.shape}"
            )
        out: NDArray[np.float64] = np.asarray(x, dtype=np.float64) @ self.matrix()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "input_dim": self.input_dim,
            "dim": self.dim,
            "generator": self.generator,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProjectionSpec:
        try:
            return cls(
                int(data["seed"]),
                int(data["input_dim"]),
                int(data["dim"]),
                str(data.get("generator", GENERATOR)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StatsFormatError(f"projection metadata is malformed: {exc!r}") from exc


@lru_cache(maxsize=8)
def _rademacher(seed: int, d: int, k: int) -> NDArray[np.float64]:
    n = d * k
    words = np.random.PCG64(seed).random_raw((n + 63) // 64).astype(np.uint64)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:n]
    if not np.little_endian:  # pragma: no cover - the view above is little-endian byte order
        raise RuntimeError("big-endian hosts are not supported by the projection generator")
    scale = 1.0 / np.sqrt(float(k))
    r: NDArray[np.float64] = np.where(bits.reshape(d, k) == 1, -scale, scale).astype(np.float64)
    r.setflags(write=False)
    return r
