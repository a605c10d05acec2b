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

Principal-direction projection (generator ``"pca-v1"``)
-------------------------------------------------------
A random projection ignores where the encoder's features vary. The alternative is a public
basis V ∈ R^{d × K}: the top K principal directions of the encoder's features on a public
dataset (never the evaluation data), computed once with :func:`pca_basis` and shipped as a
file beside the encoder (``ghofl projection-basis`` writes it). The projection to k ≤ K is
z = x V[:, :k]. The basis is identified by the first 16 hex digits of the SHA-256 of its file
(:func:`basis_fingerprint`), which the payload metadata records (``ProjectionSpec.basis``), so
payloads projected with different bases, or a basis with a different k, cannot be added; a
client that holds a basis file whose digest differs from the agreed fingerprint is refused.

Basis files are ``<fingerprint>.npy`` (float32, shape (d, K), columns orthonormal in float64
up to float32 rounding) looked up in ``$GHOFL_PROJECTION_DIR`` and then in
``~/.cache/ghofl/projections``; ``<encoder fingerprint>.json`` in the same folder names the
default basis of an encoder (written by :func:`save_basis` with ``default_for``), so
``--projection pca:<k>`` needs no digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, StatsFormatError

GENERATOR = "pcg64-rademacher-v1"
#: Generator name of the public principal-direction projection.
PCA_GENERATOR = "pca-v1"
PROJECTION_GENERATORS = (GENERATOR, PCA_GENERATOR)
#: Environment variable naming an extra folder of basis files (searched first).
BASIS_DIR_ENV = "GHOFL_PROJECTION_DIR"
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class ProjectionSpec:
    """A public random projection R ∈ R^{input_dim × dim}.

    Parameters
    ----------
    seed : int
        Public seed, agreed by all clients (non-negative; 0 for ``"pca-v1"``, which draws
        nothing).
    input_dim : int
        Encoder dimension d.
    dim : int
        Projected dimension k (1 <= k).
    generator : str
        Name of the documented generator (see module docstring): ``"pcg64-rademacher-v1"``
        (random) or ``"pca-v1"`` (public principal directions).
    basis : str
        ``"pca-v1"`` only: fingerprint (16 hex digits) of the basis file; ``""`` otherwise.
    """

    seed: int
    input_dim: int
    dim: int
    generator: str = GENERATOR
    basis: str = ""

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ConfigError(f"projection seed must be a non-negative integer; got {self.seed}")
        if self.input_dim < 1 or self.dim < 1:
            raise ConfigError(
                f"projection dims must be >= 1; got input_dim={self.input_dim}, dim={self.dim}"
            )
        if self.generator not in PROJECTION_GENERATORS:
            raise ConfigError(
                f"unknown projection generator {self.generator!r}; "
                f"this ghofl supports {', '.join(map(repr, PROJECTION_GENERATORS))}"
            )
        if self.generator == PCA_GENERATOR:
            if not _FINGERPRINT.match(self.basis):
                raise ConfigError(
                    f"a 'pca-v1' projection needs the 16-hex-digit fingerprint of its basis "
                    f"file; got basis={self.basis!r}; build one with ghofl projection-basis"
                )
            if self.dim > self.input_dim:
                raise ConfigError(
                    f"a principal-direction projection cannot have more directions (k="
                    f"{self.dim}) than the encoder dimension d={self.input_dim}; use k <= d"
                )
        elif self.basis:
            raise ConfigError(
                f"projection generator {self.generator!r} takes no basis; got "
                f"basis={self.basis!r}"
            )

    @property
    def kind(self) -> str:
        """``"random"`` or ``"pca"``."""
        return "pca" if self.generator == PCA_GENERATOR else "random"

    def describe(self) -> str:
        """Short description, e.g. ``"random k=256 seed 0"`` or ``"pca k=256 basis 0123…"``."""
        if self.kind == "pca":
            return f"pca k={self.dim} basis {self.basis}"
        return f"random k={self.dim} seed {self.seed}"

    def matrix(self) -> NDArray[np.float64]:
        """Return R, shape (input_dim, dim), float64, read-only and cached.

        Raises
        ------
        ConfigError
            ``"pca-v1"``: no basis file with this fingerprint is found, or it does not fit
            (d, k).
        """
        if self.generator == PCA_GENERATOR:
            return _pca_matrix(self.basis, self.input_dim, self.dim)
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
        """JSON-ready fields; ``basis`` only when set (random projections keep version 1's)."""
        out: dict[str, Any] = {
            "seed": self.seed,
            "input_dim": self.input_dim,
            "dim": self.dim,
            "generator": self.generator,
        }
        if self.basis:  # random projections keep their version-1 metadata unchanged
            out["basis"] = self.basis
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProjectionSpec:
        """The spec from :meth:`to_dict`'s fields; :class:`StatsFormatError` when invalid."""
        try:
            basis = data.get("basis", "")
            if not isinstance(basis, str):
                raise TypeError(f"basis must be a string, got {type(basis).__name__}")
            return cls(
                int(data["seed"]),
                int(data["input_dim"]),
                int(data["dim"]),
                str(data.get("generator", GENERATOR)),
                basis,
            )
        except ConfigError as exc:
            raise StatsFormatError(f"projection metadata is invalid: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise StatsFormatError(f"projection metadata is malformed: {exc!r}") from exc


@lru_cache(maxsize=8)
def is_fingerprint(text: str) -> bool:
    """Whether ``text`` has the form of a file fingerprint: 16 lowercase hex digits."""
    return isinstance(text, str) and _FINGERPRINT.fullmatch(text) is not None


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


# ---------------------------------------------------------------------- principal directions
def pca_basis(x: NDArray[Any], k: int) -> NDArray[np.float32]:
    """Top-``k`` principal directions of public features ``x``, as a float32 basis.

    Parameters
    ----------
    x : ndarray, shape (n, d)
        Encoder features of a public dataset (n ≥ 2).
    k : int
        Number of directions kept, 1 ≤ k ≤ d.

    Returns
    -------
    ndarray of float32, shape (d, k)
        Orthonormal eigenvectors of the sample covariance, by decreasing eigenvalue, each with
        its largest-magnitude entry positive (a deterministic sign).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ConfigError(
            f"principal directions need a 2-D array of at least 2 feature rows; got shape "
            f"{x.shape}; pass the encoder's features of a public dataset"
        )
    d = x.shape[1]
    if not 1 <= k <= d:
        raise ConfigError(f"the number of principal directions must be in 1..{d}; got {k}")
    if not np.all(np.isfinite(x)):
        raise ConfigError("the public features contain NaN or infinite values; clean them first")
    xc = x - x.mean(axis=0)
    cov = xc.T @ xc / (x.shape[0] - 1)
    w, v = np.linalg.eigh(0.5 * (cov + cov.T))
    v = v[:, np.argsort(w)[::-1][:k]]
    idx = np.argmax(np.abs(v), axis=0)
    v = v * np.sign(v[idx, np.arange(k)])
    out: NDArray[np.float32] = np.ascontiguousarray(v, dtype=np.float32)
    return out


def float32_npy(v: NDArray[Any]) -> bytes:
    """``v`` as the bytes of a little-endian float32 ``.npy`` file (a public file's content)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(v, dtype="<f4"), allow_pickle=False)
    return buf.getvalue()


def file_fingerprint(blob: bytes) -> str:
    """First 16 hex digits of the SHA-256 of a file's bytes (every public file's name)."""
    return hashlib.sha256(blob).hexdigest()[:16]


def basis_fingerprint(v: NDArray[Any]) -> str:
    """First 16 hex digits of the SHA-256 of the basis as a float32 ``.npy`` file."""
    return file_fingerprint(float32_npy(v))


def read_public_file(fingerprint: str, suffix: str, dirs: tuple[str, ...], what: str,
                     again: str) -> NDArray[np.float64] | None:
    """The array in ``<fingerprint><suffix>`` of the first folder of ``dirs`` that holds it.

    Its digest is checked against the fingerprint; None when no folder holds it.

    Raises
    ------
    ConfigError
        The file's content does not hash to ``fingerprint`` (the message names it as
        ``what`` and says how to get it again: ``again``).
    """
    for folder in dirs:
        path = Path(folder) / f"{fingerprint}{suffix}"
        if not path.is_file():
            continue
        blob = path.read_bytes()
        got = file_fingerprint(blob)
        if got != fingerprint:
            raise ConfigError(f"{what} {str(path)!r} has fingerprint {got}, not {fingerprint}; "
                              f"it was changed or corrupted; {again}")
        out: NDArray[np.float64] = np.asarray(np.load(io.BytesIO(blob), allow_pickle=False),
                                              dtype=np.float64)
        out.setflags(write=False)
        return out
    return None


def basis_dirs() -> list[Path]:
    """Folders searched for basis files: ``$GHOFL_PROJECTION_DIR``, then the user cache."""
    out = []
    env = os.environ.get(BASIS_DIR_ENV)
    if env:
        out.append(Path(env))
    out.append(Path.home() / ".cache" / "ghofl" / "projections")
    return out


def save_basis(
    v: NDArray[Any],
    directory: str | os.PathLike[str] | None = None,
    *,
    default_for: str | None = None,
    source: str = "",
) -> tuple[Path, str]:
    """Write basis ``v`` (d, K) as ``<fingerprint>.npy``; return (path, fingerprint).

    Parameters
    ----------
    v : ndarray, shape (d, K)
        From :func:`pca_basis` (stored as float32).
    directory : path, optional
        Target folder (default: the first of :func:`basis_dirs`).
    default_for : str, optional
        An encoder fingerprint: also write ``<default_for>.json`` naming this basis as that
        encoder's default (used by ``pca:<k>`` without a fingerprint).
    source : str
        Free text recorded in that JSON (e.g. the public dataset and sample count).
    """
    folder = Path(directory) if directory is not None else basis_dirs()[0]
    folder.mkdir(parents=True, exist_ok=True)
    v32 = np.asarray(v, dtype=np.float32)
    if v32.ndim != 2 or not np.all(np.isfinite(v32)):
        raise ConfigError(f"a basis must be a finite 2-D array (d, K); got shape {v32.shape}")
    blob = float32_npy(v32)
    fp = file_fingerprint(blob)
    path = folder / f"{fp}.npy"
    tmp = path.with_suffix(".npy.tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    if default_for is not None:
        info = {"basis": fp, "input_dim": int(v32.shape[0]), "max_dim": int(v32.shape[1]),
                "source": source}
        (folder / f"{default_for}.json").write_text(json.dumps(info, indent=1) + "\n")
    return path, fp


def load_basis(fingerprint: str) -> NDArray[np.float64]:
    """The basis file ``<fingerprint>.npy`` from :func:`basis_dirs`, its digest checked.

    Returns
    -------
    ndarray of float64, shape (d, K), read-only.

    Raises
    ------
    ConfigError
        No such file, or its content does not hash to ``fingerprint``.
    """
    return _load_basis_cached(fingerprint, tuple(str(p) for p in basis_dirs()))


@lru_cache(maxsize=4)
def _load_basis_cached(fingerprint: str, dirs: tuple[str, ...]) -> NDArray[np.float64]:
    out = read_public_file(fingerprint, ".npy", dirs, "basis file",
                           "fetch the federation's basis file again")
    if out is not None:
        return out
    raise ConfigError(
        f"no projection basis with fingerprint {fingerprint} in {', '.join(dirs)}; copy the "
        f"federation's {fingerprint}.npy there (or set ${BASIS_DIR_ENV}), or build one with "
        "ghofl projection-basis"
    )


def recorded_default(encoder_fingerprint: str, suffix: str, key: str,
                     command: str) -> str | None:
    """The fingerprint under ``key`` of ``<encoder_fingerprint><suffix>`` in :func:`basis_dirs`.

    The record of an encoder's default public file (a basis, a covariance); None when no folder
    holds one.

    Raises
    ------
    ConfigError
        The record is malformed or names no valid fingerprint (``command`` rebuilds it).
    """
    for folder in basis_dirs():
        path = folder / f"{encoder_fingerprint}{suffix}"
        if path.is_file():
            try:
                fp = json.loads(path.read_text())[key]
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{str(path)!r} is malformed ({exc!r}); rebuild it with "
                                  f"{command}") from exc
            if isinstance(fp, str) and is_fingerprint(fp):
                return fp
            raise ConfigError(f"{str(path)!r} names no valid {key} fingerprint; rebuild it with "
                              f"{command}")
    return None


def default_basis(encoder_fingerprint: str) -> str:
    """Fingerprint of the default basis recorded for an encoder (see :func:`save_basis`).

    Raises
    ------
    ConfigError
        No default basis is recorded for this encoder, or its record is malformed.
    """
    fp = recorded_default(encoder_fingerprint, ".json", "basis", "ghofl projection-basis")
    if fp is not None:
        return fp
    raise ConfigError(
        f"no principal-direction basis is recorded for the encoder with fingerprint "
        f"{encoder_fingerprint}; build one with ghofl projection-basis (from a public dataset), "
        "or give the basis fingerprint explicitly (pca:<k>:<fingerprint>)"
    )


@lru_cache(maxsize=8)
def _pca_matrix(fingerprint: str, d: int, k: int) -> NDArray[np.float64]:
    v = load_basis(fingerprint)
    if v.shape[0] != d or v.shape[1] < k:
        raise ConfigError(
            f"basis {fingerprint} has shape {v.shape}; a projection of {d}-dimensional "
            f"embeddings to k={k} needs ({d}, >= {k}); use the basis built for this encoder "
            f"or a k <= {v.shape[1]}"
        )
    out: NDArray[np.float64] = np.ascontiguousarray(v[:, :k])
    out.setflags(write=False)
    return out


def parse_projection(
    text: str, input_dim: int, encoder_fingerprint: str | None = None
) -> ProjectionSpec | None:
    """A projection from its command-line form.

    Forms: ``none``; ``random:<k>`` or ``random:<k>:<seed>`` (Rademacher); ``pca:<k>`` (the
    encoder's default basis) or ``pca:<k>:<basis fingerprint>``.

    Raises
    ------
    ConfigError
        Malformed text, or ``pca:<k>`` without a default basis for the encoder.
    """
    parts = text.strip().split(":")
    if parts == ["none"]:
        return None
    usage = ("expected none, random:<k>[:<seed>] or pca:<k>[:<basis fingerprint>], e.g. "
             "pca:512")
    if parts[0] not in ("random", "pca") or not 2 <= len(parts) <= 3:
        raise ConfigError(f"invalid projection {text!r}; {usage}")
    try:
        k = int(parts[1])
    except ValueError:
        raise ConfigError(f"invalid projection {text!r}: k must be an integer; {usage}") from None
    if parts[0] == "random":
        try:
            seed = int(parts[2]) if len(parts) == 3 else 0
        except ValueError:
            raise ConfigError(
                f"invalid projection {text!r}: the seed must be an integer; {usage}"
            ) from None
        return ProjectionSpec(seed, input_dim, k)
    if len(parts) == 3:
        fp = parts[2]
    elif encoder_fingerprint is None:
        raise ConfigError(
            f"projection {text!r} needs the encoder's default basis, but the encoder is "
            "unknown; give the basis fingerprint (pca:<k>:<fingerprint>)"
        )
    else:
        fp = default_basis(encoder_fingerprint)
    return ProjectionSpec(0, input_dim, k, PCA_GENERATOR, fp)
