"""Public kernel feature map: RBF similarities to public anchors, appended on the client.

The transform ``"x+sqrt+rbf:<fingerprint>"`` (:mod:`ghofl.client.transforms`) maps an
embedding x ∈ R^d to

    φ(x) = [x, s, κ·exp(−γ‖s − a_1‖²) − o_1, …, κ·exp(−γ‖s − a_K‖²) − o_K],   s = √max(x, 0),

of dimension 2d + K. The statistics of φ (sums and sums of products, as for any embedding)
then give the linear heads (LDA, ridge, …) a kernel decision function: ridge on φ is a
Nyström-style approximation of kernel ridge regression with a Gaussian kernel, computed from
one upload. Nothing about the federation's data enters the map: it is built once from a
PUBLIC dataset and shipped beside the encoder, exactly like a principal-direction basis
(:mod:`ghofl.stats.projection`).

How :func:`build_kernel_map` chooses the parameters, from the public embeddings alone:

* anchors a_k: K distinct public samples (in the s = √x space) drawn with a seeded generator;
* γ = 1 / (2·median ‖s − a_k‖²) over every public sample and anchor (the median heuristic:
  the kernel's length scale is the typical distance between points);
* κ: the kernel block is rescaled so that its mean per-feature variance on the public data
  equals that of the [x, s] block. The heads' shrinkage targets are multiples of the identity,
  so blocks of very different scale would be regularised very differently; with κ they are
  treated alike;
* o_k: the mean of κ·exp(−γ‖s − a_k‖²) over the public data, so that the kernel block is
  about centred. No head depends on this shift (they all fit a mean), but the sums do: an
  uncentred block (mean ≈ 20 standard deviations) loses its covariance to cancellation when
  the sums travel as float32.

A map is identified by the first 16 hex digits of the SHA-256 of its content
(:func:`kernel_fingerprint`: the anchors as little-endian float32, then γ, κ and the offsets
as float64),
which becomes part of the transform's name and therefore of the encoder fingerprint recorded
in every payload: payloads made with different maps cannot be added. Map files are
``<fingerprint>.rbf.npz`` in the folders of the projection bases (``$GHOFL_PROJECTION_DIR``,
then ``~/.cache/ghofl/projections``); a file whose content does not hash to its name is
refused.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.files import atomic_write
from ghofl.stats.projection import BASIS_DIR_ENV, basis_dirs

__all__ = [
    "DEFAULT_ANCHORS",
    "KernelMap",
    "build_kernel_map",
    "kernel_fingerprint",
    "load_kernel_map",
    "save_kernel_map",
]

#: Number of public anchors of :func:`build_kernel_map` (φ has 2d + K dimensions).
DEFAULT_ANCHORS = 2048
#: Rows of the input whose kernel values are computed at once ((rows, K) float64 buffers).
BLOCK_ROWS = 4096
_TAG = b"ghofl-rbf-v1\0"
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")


def kernel_fingerprint(anchors: NDArray[Any], gamma: float, scale: float,
                       offset: NDArray[Any]) -> str:
    """First 16 hex digits of the SHA-256 of a map's content.

    The content: a version tag, the shape (K, d) as two little-endian uint64, the
    anchors as little-endian float32, then γ and κ as little-endian float64, then the K
    offsets as little-endian float64.
    """
    a = np.ascontiguousarray(anchors, dtype="<f4")
    h = hashlib.sha256(_TAG)
    h.update(struct.pack("<QQ", *a.shape))
    h.update(a.tobytes())
    h.update(struct.pack("<dd", float(gamma), float(scale)))
    h.update(np.ascontiguousarray(offset, dtype="<f8").tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class KernelMap:
    """A public Gaussian-kernel feature map (module docstring).

    Parameters
    ----------
    anchors : ndarray of float32, shape (K, d)
        Public points in the s = √max(x, 0) space.
    gamma : float
        γ > 0 of exp(−γ‖s − a‖²).
    scale : float
        κ > 0, the factor of the kernel block.
    offset : ndarray of float64, shape (K,)
        o, subtracted from the kernel block (each in [0, κ]).
    source : str
        Free text: where the anchors come from (not part of the fingerprint).
    """

    anchors: NDArray[np.float32]
    gamma: float
    scale: float
    offset: NDArray[np.float64]
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        a = np.asarray(self.anchors)
        if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
            raise ConfigError(f"kernel-map anchors must be a 2-D array (K, d); got shape {a.shape}")
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise ConfigError("kernel-map anchors must be finite and non-negative (points √x)")
        for name, v in (("gamma", self.gamma), ("scale", self.scale)):
            if not (np.isfinite(v) and v > 0):
                raise ConfigError(f"kernel-map {name} must be a finite positive number; got {v!r}")
        o = np.array(self.offset, dtype=np.float64)
        if o.shape != (a.shape[0],) or not np.all(np.isfinite(o)):
            raise ConfigError(f"kernel-map offsets must be {a.shape[0]} finite numbers (one per "
                              f"anchor); got shape {o.shape}")
        if np.any(o < 0) or np.any(o > self.scale):
            raise ConfigError("kernel-map offsets must lie in [0, scale]: they are means of "
                              "kernel values")
        o.setflags(write=False)
        object.__setattr__(self, "offset", o)
        a32 = np.ascontiguousarray(a, dtype=np.float32)
        a32.setflags(write=False)
        object.__setattr__(self, "anchors", a32)
        object.__setattr__(self, "gamma", float(self.gamma))
        object.__setattr__(self, "scale", float(self.scale))

    @property
    def n_anchors(self) -> int:
        """K, the dimension of the kernel block."""
        return int(self.anchors.shape[0])

    @property
    def input_dim(self) -> int:
        """d, the dimension of the embeddings the map takes."""
        return int(self.anchors.shape[1])

    @property
    def fingerprint(self) -> str:
        """The map's fingerprint (:func:`kernel_fingerprint`)."""
        return kernel_fingerprint(self.anchors, self.gamma, self.scale, self.offset)

    def kernel_block(self, x: NDArray[Any], out: NDArray[Any] | None = None) -> NDArray[Any]:
        """The kernel block (n, K) of ``x`` (n, d): κ·exp(−γ‖√max(x, 0) − a_k‖²) − o_k.

        Computed in float64, :data:`BLOCK_ROWS` rows at a time, and written into ``out``
        (n, K) when given (any float dtype), else into a new array of ``x``'s float dtype.

        Raises
        ------
        ConfigError
            ``x`` is not (n, d) with the map's d.
        """
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            raise ConfigError(
                f"the kernel feature map {self.fingerprint} was built for {self.input_dim}-"
                f"dimensional embeddings; got shape {x.shape}; use the map built for this "
                "encoder (ghofl feature-map)"
            )
        dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
        res = np.empty((x.shape[0], self.n_anchors), dtype=dtype) if out is None else out
        a = self.anchors.astype(np.float64)
        a_sq = np.einsum("ij,ij->i", a, a)
        for s0 in range(0, x.shape[0], BLOCK_ROWS):
            s = np.sqrt(np.maximum(np.asarray(x[s0 : s0 + BLOCK_ROWS], dtype=np.float64), 0.0))
            d2 = _sq_distances(s, a, a_sq)
            d2 *= -self.gamma
            np.exp(d2, out=d2)
            d2 *= self.scale
            d2 -= self.offset
            res[s0 : s0 + s.shape[0]] = d2
        return res

    def apply(self, x: NDArray[Any]) -> NDArray[Any]:
        """The feature map φ(x) = [x, √max(x, 0), kernel block], shape (n, 2d + K).

        In ``x``'s float dtype (float64 for integer input).
        """
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            self.kernel_block(x)  # raises with the message about the dimension
        dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
        n, d = x.shape
        out = np.empty((n, 2 * d + self.n_anchors), dtype=dtype)
        out[:, :d] = x
        np.sqrt(np.maximum(x, 0), out=out[:, d : 2 * d])
        self.kernel_block(x, out=out[:, 2 * d :])
        return out

    def norm_bound(self) -> float:
        """Bound √Σ_k max(o_k, κ − o_k)² on the kernel block's L2 norm, whatever the input.

        Every kernel value lies in (0, κ], so entry k of the block lies in (−o_k, κ − o_k].
        """
        return float(np.sqrt(np.sum(np.maximum(self.offset, self.scale - self.offset) ** 2)))


def _sq_distances(s: NDArray[np.float64], anchors: NDArray[np.float64],
                  anchors_sq: NDArray[np.float64]) -> NDArray[np.float64]:
    """Squared distances ‖s_i − a_k‖² (n, K) of rows s (n, d) to anchors (K, d).

    With ‖a_k‖² given, through one matrix product; rounding below 0 is clipped.
    """
    d2: NDArray[np.float64] = (np.einsum("ij,ij->i", s, s)[:, None] - 2.0 * (s @ anchors.T)
                               + anchors_sq[None, :])
    np.maximum(d2, 0.0, out=d2)
    return d2


def build_kernel_map(
    x_public: NDArray[Any],
    n_anchors: int = DEFAULT_ANCHORS,
    seed: int = 0,
    source: str = "",
) -> KernelMap:
    """A kernel map from PUBLIC embeddings (never the federation's data).

    Parameters
    ----------
    x_public : ndarray, shape (n, d)
        Embeddings of a public dataset made with the federation's encoder; n ≥ ``n_anchors``.
    n_anchors : int, default :data:`DEFAULT_ANCHORS`
        K, the number of anchors (distinct rows of ``x_public``).
    seed : int
        Seed of ``numpy.random.default_rng`` that picks the anchors.
    source : str
        Free text recorded with the map (e.g. the dataset and its size).

    Returns
    -------
    KernelMap
        Anchors √x of K rows, γ by the median heuristic, κ matching the block variances
        (module docstring).

    Raises
    ------
    ConfigError
        Too few or non-finite samples, or data without spread (all samples alike).
    """
    x = np.asarray(x_public, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ConfigError(f"public embeddings must be a 2-D array (n, d); got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ConfigError("public embeddings contain NaN or infinite values; clean them first")
    if int(n_anchors) < 1:
        raise ConfigError(f"the number of anchors must be at least 1; got {n_anchors}")
    if x.shape[0] < n_anchors:
        raise ConfigError(
            f"{n_anchors} anchors need at least as many public samples; got {x.shape[0]} "
            "(embed more public data, or ask for fewer anchors)"
        )
    s = np.sqrt(np.maximum(x, 0.0))
    idx = np.sort(np.random.default_rng(seed).choice(x.shape[0], int(n_anchors), replace=False))
    anchors = s[idx]
    a_sq = np.einsum("ij,ij->i", anchors, anchors)
    d2 = np.empty((x.shape[0], anchors.shape[0]))
    for s0 in range(0, x.shape[0], BLOCK_ROWS):
        blk = s[s0 : s0 + BLOCK_ROWS]
        d2[s0 : s0 + blk.shape[0]] = _sq_distances(blk, anchors, a_sq)
    med = float(np.median(d2))
    if not med > 0:
        raise ConfigError(
            "the public embeddings have no spread (the median distance to the anchors is 0); "
            "use a public dataset of varied samples"
        )
    gamma = 1.0 / (2.0 * med)
    d2 *= -gamma
    np.exp(d2, out=d2)
    kernel_mean = np.mean(d2, axis=0)
    kernel_var = float(np.mean(np.var(d2, axis=0)))
    base_var = float(np.mean(np.concatenate([np.var(x, axis=0), np.var(s, axis=0)])))
    if not (kernel_var > 0 and base_var > 0):
        raise ConfigError(
            "the public embeddings give a constant kernel block; use a public dataset of "
            "varied samples"
        )
    scale = float(np.sqrt(base_var / kernel_var))
    return KernelMap(anchors.astype(np.float32), gamma, scale, scale * kernel_mean,
                     source=source)


def _map_path(folder: Path, fingerprint: str) -> Path:
    return folder / f"{fingerprint}.rbf.npz"


def save_kernel_map(
    m: KernelMap, directory: str | os.PathLike[str] | None = None
) -> tuple[Path, str]:
    """Write ``m`` atomically as ``<fingerprint>.rbf.npz``; return (path, fingerprint).

    Into ``directory``, by default the first of the projection-basis folders.
    """
    folder = Path(directory) if directory is not None else basis_dirs()[0]
    fp = m.fingerprint
    buf = io.BytesIO()
    np.savez(buf, anchors=np.ascontiguousarray(m.anchors, dtype="<f4"),
             params=np.array([m.gamma, m.scale], dtype="<f8"),
             offset=np.ascontiguousarray(m.offset, dtype="<f8"),
             source=np.array(m.source))
    path = _map_path(folder, fp)
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(buf.getvalue()))
    return path, fp


def load_kernel_map(fingerprint: str) -> KernelMap:
    """The map ``<fingerprint>.rbf.npz`` from the basis folders, its content checked.

    Raises
    ------
    ConfigError
        Malformed fingerprint, no such file, an unreadable file, or content that does not hash
        to ``fingerprint``.
    """
    if not _FINGERPRINT.match(fingerprint):
        raise ConfigError(
            f"a kernel-map fingerprint is 16 lower-case hex digits; got {fingerprint!r}"
        )
    return _load_cached(fingerprint, tuple(str(p) for p in basis_dirs()))


@lru_cache(maxsize=4)
def _load_cached(fingerprint: str, dirs: tuple[str, ...]) -> KernelMap:
    for folder in dirs:
        path = _map_path(Path(folder), fingerprint)
        if not path.is_file():
            continue
        try:
            with np.load(path, allow_pickle=False) as z:
                anchors = np.asarray(z["anchors"], dtype=np.float32)
                params = np.asarray(z["params"], dtype=np.float64)
                offset = np.asarray(z["offset"], dtype=np.float64)
                source = str(z["source"]) if "source" in z.files else ""
            gamma, scale = float(params[0]), float(params[1])
            m = KernelMap(anchors, gamma, scale, offset, source=source)
        except (OSError, ValueError, KeyError, IndexError, ConfigError) as exc:
            raise ConfigError(
                f"kernel-map file {str(path)!r} is unreadable ({exc}); fetch the federation's "
                "map file again"
            ) from exc
        got = m.fingerprint
        if got != fingerprint:
            raise ConfigError(
                f"kernel-map file {str(path)!r} has fingerprint {got}, not {fingerprint}; it "
                "was changed or corrupted; fetch the federation's map file again"
            )
        return m
    raise ConfigError(
        f"no kernel feature map with fingerprint {fingerprint} in {', '.join(dirs)}; copy the "
        f"federation's {fingerprint}.rbf.npz there (or set ${BASIS_DIR_ENV}), or build one "
        "with ghofl feature-map"
    )
