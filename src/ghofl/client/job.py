"""The client half of a one-shot federation: local data → validated :class:`ClientStats`.

:class:`ClientJob` is what every client must agree on (class list, upload mode, encoder,
feature transform, projection, clipping bound); it travels in a run config under the keys of
``ghofl.server.fields.FIELDS`` (``ghofl.server.config.plan_to_config``), which reads each
field's type and default from this class. :func:`client_statistics` is the one client function
that ``ghofl client-stats``, the in-process simulator and the Flower ClientApp all call.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.base import Encoder
from ghofl.client.encoders.factory import get_encoder
from ghofl.client.transforms import (
    apply_feature_transform,
    check_feature_transform,
    transformed_info,
)
from ghofl.data.embeddings import (
    DEFAULT_RANGE_HINT,
    Embeddings,
    align_labels,
    check_labelled_embeddings,
    load_embeddings,
)
from ghofl.errors import ConfigError, FieldError, InputError, StatsValidationError
from ghofl.stats.accumulate import StatsAccumulator, compute_stats
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import EncoderInfo, Mode, StatsMeta, check_holdout_fraction
from ghofl.stats.projection import PCA_GENERATOR, ProjectionSpec
from ghofl.stats.schema import SCHEMAS, schema_for
from ghofl.stats.transport import TRANSPORT_DTYPES

__all__ = ["ClientJob", "client_statistics", "suppress_small_classes"]

Source = str | os.PathLike[str] | tuple[NDArray[Any], NDArray[Any]] | Embeddings
_BACKENDS = ("onnx", "torch")


@dataclass(frozen=True)
class ClientJob:
    """What every client of a federation must agree on.

    Attributes
    ----------
    classes : tuple of str
        The federation's class list; labels are indices into it.
    mode : {"full", "pooled", "gram", "diag", "means"}, default "full"
        Upload mode.
    encoder : str or None
        Registered encoder name (:func:`~ghofl.client.encoders.get_encoder`) for raw data;
        ``None``: the inputs are embeddings.
    resolution : int, default 224
        Input resolution of image encoders.
    backend : {"onnx", "torch"}, default "onnx"
        Runtime of the encoder.
    feature_transform : {"none", "sqrt", "x+sqrt"}, default "none"
        Applied to the encoder output (or to the given embeddings) before the statistics.
    projection_dim : int or None
        Dimension k of the public random projection; ``None``: no projection.
    projection_seed : int, default 0
        Public seed of the projection.
    projection_basis : str, default ""
        ``""``: the projection is the seeded random one; else the 16-hex-digit fingerprint of
        a public principal-direction basis file (:mod:`ghofl.stats.projection`), whose first
        ``projection_dim`` columns project the embeddings.
    clip_norm : float or None
        Per-sample L2 clipping bound R (> 0); ``None``: no clipping.
    encoder_name : str or None
        Name recorded in the payload for embeddings inputs when ``encoder`` is ``None`` (the
        ``--encoder-name`` of ``ghofl client-stats``); clients must agree on it.
    min_class_count : int, default 1
        Minimum-count rule: the client drops every class of which it holds fewer than this
        many samples before computing its statistics (with N_c = 1 the class sum would be a
        raw embedding). 1 keeps every class, so payloads are unchanged by default; ``ghofl
        simulate`` and the Flower apps default to 5 with differential privacy, else to 1
        (docs/privacy.md).
    holdout_fraction : float, default 0.0
        Fraction f in (0, 0.5] of its samples each client holds out: its payload carries,
        besides the sums over all samples, those of the held-out samples (the held-out
        section, :attr:`ClientStats.holdout <ghofl.stats.ClientStats.holdout>`), so the
        server can score hyperparameters on held-out moments. 0.0: no section.
    holdout_seed : int, default 0
        Seed of the per-sample split (:func:`~ghofl.stats.accumulate.holdout_mask`).
    transport_dtype : {"float64", "float32"}, default "float64"
        Dtype of the float sums as they travel in plain uploads and ``.ghs`` files (float32
        halves the bytes; the server accumulates in float64). Secure aggregation ignores it:
        it sends its own fixed-point encoding of the float64 sums.
    """

    classes: tuple[str, ...]
    mode: Mode = "full"
    encoder: str | None = None
    resolution: int = 224
    backend: str = "onnx"
    feature_transform: str = "none"
    projection_dim: int | None = None
    projection_seed: int = 0
    clip_norm: float | None = None
    projection_basis: str = ""
    encoder_name: str | None = None
    min_class_count: int = 1
    holdout_fraction: float = 0.0
    holdout_seed: int = 0
    transport_dtype: str = "float64"

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", _check_classes(self.classes))
        object.__setattr__(self, "mode", _check_mode(self.mode))
        for key in ("encoder", "encoder_name"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(
                    f"ClientJob {key} must be a non-empty name or None; got {value!r}"
                )
        object.__setattr__(self, "resolution", _int(self.resolution, "resolution", low=1))
        if self.backend not in _BACKENDS:
            backend = self.backend
            raise FieldError("client.backend", lambda n: (
                f"{n.name('client.backend')} must be one of {', '.join(_BACKENDS)}; got "
                f"{backend!r}"))
        check_feature_transform(self.feature_transform)
        if self.projection_dim is not None:
            object.__setattr__(
                self, "projection_dim", _int(self.projection_dim, "projection_dim", low=1)
            )
        object.__setattr__(
            self, "projection_seed", _int(self.projection_seed, "projection_seed", low=0)
        )
        if self.clip_norm is not None:
            object.__setattr__(self, "clip_norm", _clip(self.clip_norm))
        object.__setattr__(
            self, "min_class_count", _int(self.min_class_count, "min_class_count", low=1)
        )
        object.__setattr__(self, "holdout_fraction", _holdout(self.holdout_fraction))
        object.__setattr__(self, "holdout_seed", _int(self.holdout_seed, "holdout_seed", low=0))
        if self.holdout_seed >= 2**63:
            seed = self.holdout_seed
            raise FieldError("client.holdout_seed", lambda n: (
                f"{n.name('client.holdout_seed')} must be below 2^63; got {seed}"))
        if self.transport_dtype not in TRANSPORT_DTYPES:
            dtype = self.transport_dtype
            raise FieldError("client.transport_dtype", lambda n: (
                f"{n.name('client.transport_dtype')} must be one of "
                f"{', '.join(TRANSPORT_DTYPES)}; got {dtype!r}"))
        if self.projection_basis and (
            not isinstance(self.projection_basis, str)
            or not re.fullmatch(r"[0-9a-f]{16}", self.projection_basis)
            or self.projection_dim is None
        ):
            basis, k = self.projection_basis, self.projection_dim
            raise FieldError("client.projection_basis", lambda n: (
                f"{n.name('client.projection_basis')} must be '' or the 16-hex-digit "
                "fingerprint of a principal-direction basis, with "
                f"{n.name('client.projection_dim')} set; got {basis!r} (projection_dim={k})"))

    # ------------------------------------------------------------------ fingerprint
    def encoder_info(self, input_dim: int | None = None) -> EncoderInfo | None:
        """The encoder fingerprint recorded in this job's payloads (after the transform).

        Parameters
        ----------
        input_dim : int, optional
            Dimension d of the embeddings given to the client (before the feature transform);
            checked against the registered encoder, required when only ``encoder_name`` is set.

        Returns
        -------
        EncoderInfo or None
            ``None`` when the job names no encoder.

        Raises
        ------
        InputError
            ``input_dim`` differs from the registered encoder's output dimension.
        ConfigError
            Unknown encoder, or ``encoder_name`` without ``input_dim``.
        """
        if self.encoder is not None:
            info = self.build_encoder().info
            if input_dim is not None and int(input_dim) != info.dim:
                raise InputError(
                    f"the embeddings have d={input_dim} but encoder {self.encoder!r} produces "
                    f"d={info.dim}; embed the data with the job's encoder"
                )
        elif self.encoder_name is not None:
            if input_dim is None:
                raise ConfigError(
                    f"the fingerprint of encoder_name {self.encoder_name!r} needs the "
                    "embedding dimension; pass input_dim"
                )
            info = EncoderInfo(self.encoder_name, int(input_dim))
        else:
            return None
        return transformed_info(info, self.feature_transform)

    def build_encoder(self) -> Encoder:
        """The job's registered encoder (``get_encoder(encoder, resolution, backend)``)."""
        if self.encoder is None:
            raise ConfigError(
                "this client job has no encoder (encoder is None: its inputs are embeddings); "
                "set encoder to a registered encoder name to embed raw data"
            )
        return get_encoder(self.encoder, resolution=self.resolution, backend=self.backend)

    def projection(self, input_dim: int) -> ProjectionSpec | None:
        """The public projection of embeddings of dimension ``input_dim`` (after the transform)."""
        if self.projection_dim is None:
            return None
        if self.projection_basis:
            return ProjectionSpec(0, int(input_dim), self.projection_dim, PCA_GENERATOR,
                                  self.projection_basis)
        return ProjectionSpec(self.projection_seed, int(input_dim), self.projection_dim)

    def stats_meta(self, input_dim: int, encoder_info: EncoderInfo | None = None) -> StatsMeta:
        """Metadata of every payload of this job for embeddings of dimension ``input_dim``.

        ``input_dim`` is counted after the transform. E.g. what a secure-aggregation server must
        know beforehand.
        """
        return StatsAccumulator(self.classes, input_dim, self.mode, encoder_info,
                                self.projection(input_dim), clip_norm=self.clip_norm,
                                holdout_fraction=self.holdout_fraction,
                                holdout_seed=self.holdout_seed).meta


# ---------------------------------------------------------------------- the client function
def client_statistics(
    source: Source,
    job: ClientJob,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    encoder_info: EncoderInfo | None = None,
    split: str | None = None,
    batch_size: int = 64,
    progress: bool = False,
    range_hint: str | None = None,
    sample_ids: NDArray[Any] | None = None,
) -> ClientStats:
    """One client's statistics from its local data, as the job prescribes.

    Parameters
    ----------
    source : path, (x, y) pair or Embeddings
        * an embeddings ``.npz`` (``x`` (n, d), ``y`` (n,), optionally ``classes`` (C',)),
          or an :class:`~ghofl.data.embeddings.Embeddings` already read from one;
        * an in-memory pair ``(x (n, d), y (n,))`` of embeddings, labels indexing
          ``job.classes`` (what the simulator gives each client);
        * raw data when ``job.encoder`` is set: an ImageFolder directory or ``.zip``
          (``<root>/<split>/<class>/<image>``), or a text file (all of it) of ``<label>
          <text>`` lines or ``.csv``/``.tsv`` rows with a label column (encoding detected,
          blank lines skipped; :mod:`ghofl.data.text`), or a folder holding a ``train`` and
          a ``test`` text file (``split`` picks one); text labels are class names or
          indices of ``job.classes`` (``COARSE:fine`` labels keep the coarse part).
    job : ClientJob
        Classes, mode, encoder, transform, projection and clipping bound.
    cache_dir : path, optional
        Embedding cache for raw data (default ``GHOFL_CACHE_DIR`` or ``~/.cache/ghofl``).
    encoder_info : EncoderInfo, optional
        Fingerprint of the encoder that produced embeddings inputs (overrides the one the job
        implies; the job's transform is still applied).
    split : str, optional
        Split of the raw data (:func:`ghofl.data.by_path.open_path`); default: a whole single
        text file, ``train`` of a folder of text files, and for an image layout its
        ``train`` folder when it has one, else the class folders at its root.
    batch_size : int, default 64
        Items per encoder call (raw data).
    progress : bool, default False
        Progress bar while encoding.
    range_hint : str, optional
        The fix suggested when a label is out of range.
    sample_ids : array_like of int, shape (n,), optional
        Global ids of the samples of an in-memory ``(x, y)`` source, for the held-out split
        (e.g. their rows in a dataset split among simulated clients: the held-out totals are
        then partition invariant); default their positions 0..n-1. Ignored for other sources
        and without ``job.holdout_fraction``.

    Returns
    -------
    ClientStats
        Over ``job.classes``, in ``job.mode``, projected and clipped as the job says, with the
        encoder fingerprint in its metadata.

    Raises
    ------
    InputError
        Malformed embeddings or labels, a source whose class names disagree with
        ``job.classes`` (both lists are named), or embeddings of the wrong dimension.
    DataError
        Raw data that cannot be read.
    ConfigError
        Raw data without ``job.encoder``.
    """
    hint = range_hint or DEFAULT_RANGE_HINT
    if isinstance(source, tuple):
        if len(source) != 2:
            raise InputError(
                f"an in-memory client source must be a pair (x, y); got {len(source)} items"
            )
        x, y = _checked_pair(source[0], source[1], len(job.classes), "client", hint)
        ids = None
        if sample_ids is not None:
            ids = np.asarray(sample_ids)
            if ids.shape != (x.shape[0],):
                raise InputError(
                    f"sample_ids must have shape ({x.shape[0]},) to match the client's "
                    f"embeddings; got {ids.shape}"
                )
        return _embeddings_stats(x, y, job, encoder_info, ids, what="client", hint=hint)
    if isinstance(source, Embeddings) or _is_npz(source):
        emb = source if isinstance(source, Embeddings) else load_embeddings(Path(source))
        what = f"'{emb.path}'"
        labels = align_labels(emb.y, emb.classes, job.classes, what)
        x, y = _checked_pair(emb.x, labels, len(job.classes), what, hint)
        return _embeddings_stats(x, y, job, encoder_info, what=what, hint=hint)
    return _raw_stats(Path(source), job, cache_dir, split, batch_size, progress)


def _is_npz(source: str | os.PathLike[str]) -> bool:
    return Path(source).suffix.lower() == ".npz"


def _checked_pair(
    x: Any, y: Any, num_classes: int, what: str, hint: str
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Embeddings (n, d) as float64 and labels (n,) as int64, checked except for finiteness.

    Shapes, dtypes and labels are checked by
    :func:`~ghofl.data.embeddings.check_labelled_embeddings` on a zero-width view of the
    embeddings (the same messages, without its pass over every entry); whether the entries
    are finite is read from the class sums afterwards (:func:`_embeddings_stats`).
    """
    xa = np.asarray(x)
    _, y64 = check_labelled_embeddings(xa[:, :0] if xa.ndim == 2 else xa, y, num_classes,
                                       what, range_hint=hint)
    return np.asarray(xa, dtype=np.float64), y64


def _embeddings_stats(
    x: NDArray[np.float64], y: NDArray[np.int64], job: ClientJob, info: EncoderInfo | None,
    sample_ids: NDArray[Any] | None = None, *, what: str, hint: str,
) -> ClientStats:
    """The statistics of embeddings ``x`` (n, d) checked by :func:`_checked_pair`.

    The entries of ``x`` are finite exactly when the class sums of the statistics are (a NaN
    or an infinity stays non-finite through the projection, clipping and every sum), so they
    are checked in O(C·d) there, and the pass of
    :func:`~ghofl.data.embeddings.check_labelled_embeddings` over ``x``, which names the first
    bad row, runs only when a sum is not finite (or overflowed). A feature transform can map
    an infinity to a finite value and the minimum-count rule drops rows, so with either the
    pass runs first.
    """
    deferred = job.feature_transform == "none" and (
        job.min_class_count == 1 or _kept_rows(y, len(job.classes), job.min_class_count) is None
    )
    if not deferred:
        check_labelled_embeddings(x, y, len(job.classes), what, range_hint=hint)
    with np.errstate(invalid="ignore"):  # a bad entry's NaNs are reported just below
        stats = _transformed_stats(x, y, job, info, sample_ids)
    if deferred and not np.isfinite(stats.sums).all():
        check_labelled_embeddings(x, y, len(job.classes), what, range_hint=hint)
    return stats


def _transformed_stats(
    x: NDArray[np.float64], y: NDArray[np.int64], job: ClientJob, info: EncoderInfo | None,
    sample_ids: NDArray[Any] | None = None,
) -> ClientStats:
    if info is not None:
        if info.dim != x.shape[1]:
            raise InputError(
                f"encoder {info.name!r} declares d={info.dim} but the embeddings have "
                f"d={x.shape[1]}; pass the EncoderInfo of the encoder that produced them"
            )
        info = transformed_info(info, job.feature_transform)
    else:
        info = job.encoder_info(x.shape[1])
    return _finish(apply_feature_transform(x, job.feature_transform), y, job, info, sample_ids)


def _finish(
    x: NDArray[Any], y: NDArray[np.int64], job: ClientJob, info: EncoderInfo | None,
    sample_ids: NDArray[Any] | None = None,
) -> ClientStats:
    ids = sample_ids
    if job.holdout_fraction > 0 and ids is None:
        ids = np.arange(x.shape[0], dtype=np.int64)  # positions before any row is dropped
    if job.min_class_count > 1:
        keep = _kept_rows(y, len(job.classes), job.min_class_count)
        if keep is not None:
            x, y = x[keep], y[keep]
            ids = None if ids is None else ids[keep]
    # x was checked finite (check_labelled_embeddings; the transforms keep it so)
    return compute_stats(x, y, job.classes, job.mode, info, job.projection(x.shape[1]),
                         clip_norm=job.clip_norm, holdout_fraction=job.holdout_fraction,
                         holdout_seed=job.holdout_seed, sample_ids=ids, finite=True)


def suppress_small_classes(
    x: NDArray[Any], y: NDArray[np.int64], num_classes: int, min_count: int
) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """The minimum-count rule: drop the rows of every class with fewer than ``min_count`` rows.

    Parameters
    ----------
    x : ndarray, shape (n, d)
    y : ndarray of int64, shape (n,), labels in ``0..num_classes-1``
    num_classes : int
    min_count : int
        k; classes with 1 <= N_c < k are dropped (their counts and sums become 0).

    Returns
    -------
    x, y : the kept rows (a view-free copy only when something is dropped).
    """
    keep = _kept_rows(y, num_classes, min_count)
    if keep is None:
        return x, y
    return x[keep], y[keep]


def _kept_rows(y: NDArray[np.int64], num_classes: int, min_count: int) -> NDArray[np.bool_] | None:
    """Rows the minimum-count rule keeps (n,), or ``None`` when it keeps them all."""
    counts = np.bincount(y, minlength=num_classes)
    small = (counts > 0) & (counts < min_count)
    if not np.any(small):
        return None
    keep: NDArray[np.bool_] = ~small[y]
    return keep


def _raw_stats(
    path: Path, job: ClientJob, cache_dir: str | os.PathLike[str] | None,
    split: str | None, batch_size: int, progress: bool,
) -> ClientStats:
    """Raw data through the one embedding path of every client.

    That path, :func:`~ghofl.client.local_data.embed_local_data`, serves ``ghofl embed``,
    ``ghofl client-stats --data`` and the Flower ClientApp.
    """
    from ghofl.client.local_data import embed_local_data

    if job.encoder is None:
        raise ConfigError(
            f"'{path}' is not an embeddings .npz archive, and the client job names no encoder "
            "to embed raw data with; set the job's encoder (e.g. 'efficientnet-lite0') or give "
            "embeddings"
        )
    coarse = not any(":" in c for c in job.classes)
    local = embed_local_data(path, job.build_encoder(), split=split, classes=job.classes,
                             coarse=coarse, cache_dir=cache_dir, batch_size=batch_size,
                             progress=progress)
    what = f"'{path}'"
    labels = align_labels(local.y, local.classes, job.classes, what)
    xx, yy = check_labelled_embeddings(local.x, labels, len(job.classes), what)
    info = transformed_info(local.info, job.feature_transform)
    return _finish(apply_feature_transform(xx, job.feature_transform), yy, job, info)


# ---------------------------------------------------------------------- validation
def _check_classes(classes: Any) -> tuple[str, ...]:
    if isinstance(classes, str) or not hasattr(classes, "__iter__"):
        raise ConfigError(
            f"ClientJob classes must be a sequence of class names; got {classes!r}"
        )
    names = tuple(str(c) for c in classes)
    if not names or not all(n.strip() for n in names):
        raise ConfigError(
            f"ClientJob classes must name at least one class, each non-empty; got {list(names)}"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"ClientJob classes must be unique; got {list(names)}")
    return names


def _check_mode(mode: Any) -> Mode:
    try:
        return schema_for(mode).mode
    except (StatsValidationError, KeyError, TypeError):
        raise ConfigError(f"mode must be one of {', '.join(SCHEMAS)}; got {mode!r}") from None


def _int(value: Any, key: str, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise FieldError(f"client.{key}", lambda n: (
            f"{n.name('client.' + key)} must be an integer >= {low}; got {value!r}"))
    return int(value)


def _holdout(value: Any) -> float:
    try:
        return check_holdout_fraction(value)
    except StatsValidationError as exc:
        reason = str(exc)
        raise FieldError("client.holdout_fraction", lambda n: (
            f"{n.name('client.holdout_fraction')}: {reason}")) from None


def _clip(value: Any) -> float:
    ok = isinstance(value, int | float | np.number) and not isinstance(value, bool)
    if not ok or not (math.isfinite(float(value)) and float(value) > 0):
        raise FieldError("client.clip_norm", lambda n: (
            f"{n.name('client.clip_norm')} (the per-sample L2 clipping bound R) must be a "
            f"finite number > 0; got {value!r}; pass a positive bound, or none for no "
            "clipping"))
    return float(value)
