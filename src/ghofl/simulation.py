"""In-process one-shot federation: partition → client statistics → aggregate → heads → accuracy.

Used by ``ghofl simulate`` and by the experiment runner. Each simulated client computes its
statistics from its own rows only (computed when its protocol asks for them), the clients and
the server run an aggregation protocol over the in-memory transport — the plain one-stage sum,
or the secure protocol of :mod:`ghofl.secure` — and every head is fitted from the total alone,
exactly what a real server would see.

Heads are handled generically through the registry (:mod:`ghofl.heads.registry`): any head
accepting a ``seed`` parameter gets the simulation seed, any head accepting ``progress`` gets
the ``progress`` flag, unless ``head_params`` sets them.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.data.partition import dirichlet_partition
from ghofl.errors import ConfigError, InputError, StatsValidationError, UnsupportedModeError
from ghofl.heads.base import Head
from ghofl.heads.registry import available_heads, head_class, make_head, parse_head_list
from ghofl.secure import (
    AggregationReport,
    InMemoryTransport,
    PlainClient,
    PlainServer,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    run_aggregation,
)
from ghofl.stats.accumulate import StatsAccumulator, compute_stats
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import EncoderInfo, Mode
from ghofl.stats.projection import ProjectionSpec
from ghofl.stats.schema import SCHEMAS, mode_supports, schema_for

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

__all__ = [
    "HeadResult",
    "SimulationResult",
    "build_heads",
    "check_labelled_embeddings",
    "head_defaults",
    "simulate_federation",
    "to_jsonable",
]


@dataclass(frozen=True)
class HeadResult:
    """Outcome of one head in a simulation.

    Attributes
    ----------
    accuracy : float
        Test accuracy in [0, 1].
    fit_seconds : float
        Server time to fit the head from the aggregate.
    predict_seconds : float
        Time to predict the whole test set.
    params : dict
        The head's hyperparameters (``get_params()`` after fitting).
    """

    accuracy: float
    fit_seconds: float
    predict_seconds: float
    params: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "fit_seconds": self.fit_seconds,
            "predict_seconds": self.predict_seconds,
            "params": {k: to_jsonable(v) for k, v in self.params.items()},
        }


@dataclass(frozen=True)
class SimulationResult:
    """Everything one simulated federation measured; :meth:`to_dict` is the JSON contract.

    Attributes
    ----------
    heads : dict of str to HeadResult
        Per head, in the order requested.
    clients, alpha, seed, mode, projection_dim, projection_seed :
        The configuration simulated (``projection_dim`` is ``None`` without projection).
    upload_bytes_per_client : int
        Array bytes of one client's payload (:func:`~ghofl.stats.payload_nbytes`); the same
        for every client because it depends only on mode, classes and dimension.
    n_train, n_test, num_classes : int
    classes : list of str
        Class names; predictions index into it.
    stage_seconds : dict of str to float
        ``partition``, ``client_stats`` (all clients, sequentially), ``client_stats_max``
        (slowest single client), ``aggregate``, and ``fit/<head>``, ``evaluate/<head>``.
    client_sizes : list of int
        Training samples per client (length ``clients``).
    aggregation : dict
        :meth:`~ghofl.secure.AggregationReport.to_dict` of the protocol run: ``protocol``
        (``"plain"`` or ``"secure"``), per-stage seconds and bytes, survivors, dropped and
        excluded clients, public parameters.
    clip_norm : float or None
        Per-sample L2 clipping bound R applied by every client.
    n_clipped : int
        Training samples (of the surviving clients) that clipping scaled down.
    predictions : dict of str to ndarray of int64, shape (n_test,)
        Test predictions per head (not part of :meth:`to_dict`).
    """

    heads: dict[str, HeadResult]
    clients: int
    alpha: float
    seed: int
    mode: Mode
    projection_dim: int | None
    projection_seed: int | None
    upload_bytes_per_client: int
    n_train: int
    n_test: int
    num_classes: int
    classes: list[str]
    stage_seconds: dict[str, float]
    client_sizes: list[int]
    aggregation: dict[str, Any] = field(default_factory=dict)
    clip_norm: float | None = None
    n_clipped: int = 0
    predictions: dict[str, I64] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary: every attribute but ``predictions``, plus ``ghofl_version``.

        ``heads`` maps each head name to ``{"accuracy", "fit_seconds", "predict_seconds",
        "params"}``.
        """
        from ghofl import __version__

        return {
            "heads": {name: r.to_dict() for name, r in self.heads.items()},
            "clients": self.clients,
            "alpha": self.alpha,
            "seed": self.seed,
            "mode": self.mode,
            "projection_dim": self.projection_dim,
            "projection_seed": self.projection_seed,
            "upload_bytes_per_client": self.upload_bytes_per_client,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "num_classes": self.num_classes,
            "classes": list(self.classes),
            "stage_seconds": dict(self.stage_seconds),
            "client_sizes": list(self.client_sizes),
            "clip_norm": self.clip_norm,
            "n_clipped": self.n_clipped,
            "aggregation": dict(self.aggregation),
            "ghofl_version": __version__,
        }


def simulate_federation(
    x_train: NDArray[Any],
    y_train: NDArray[Any],
    x_test: NDArray[Any],
    y_test: NDArray[Any],
    *,
    classes: int | Sequence[str],
    clients: int,
    alpha: float,
    seed: int,
    heads: Sequence[str] | str,
    head_params: dict[str, dict[str, Any]] | None = None,
    mode: Mode = "full",
    projection_dim: int | None = None,
    projection_seed: int = 0,
    encoder: EncoderInfo | None = None,
    min_per_client: int = 0,
    clip_norm: float | None = None,
    secure: SecAggConfig | None = None,
    drops: Mapping[str, int] | None = None,
    progress: bool = False,
) -> SimulationResult:
    """Simulate a one-shot federation on embeddings and evaluate every head on a test set.

    Parameters
    ----------
    x_train : array_like, shape (n_train, d)
        Finite training embeddings.
    y_train : array_like of int, shape (n_train,)
        Training labels in ``0..C-1``.
    x_test : array_like, shape (n_test, d)
    y_test : array_like of int, shape (n_test,)
    classes : int or sequence of str
        Number of classes C or their names.
    clients : int
        Number of clients K (Dirichlet partition of the training set).
    alpha : float
        Dirichlet concentration of the label skew.
    seed : int
        Seeds the partition, and every head that takes a ``seed`` (unless ``head_params`` does).
    heads : sequence of str or str
        Registered head names (or ``"nb,lda"``, or ``"all"``).
    head_params : dict of str to dict, optional
        Hyperparameters per head name, e.g. ``{"lda": {"shrinkage": "auto"}}``; entries for
        registered heads not in ``heads`` are ignored.
    mode : {"full", "pooled", "diag"}, default "full"
        Upload mode of every client.
    projection_dim : int, optional
        Dimension k of a public random projection applied by every client.
    projection_seed : int, default 0
        Public seed of that projection.
    encoder : EncoderInfo, optional
        Encoder fingerprint stored in the payloads.
    min_per_client : int, default 0
        Redraw the partition until every client holds at least this many samples.
    clip_norm : float, optional
        Per-sample L2 clipping bound R every client applies (‖x‖ ≤ R); required by ``secure``.
    secure : SecAggConfig, optional
        Run the secure protocol with these parameters (default: the plain sum). Its
        ``clip_norm`` is used when ``clip_norm`` is not given; the two must agree.
    drops : mapping of str to int, optional
        Clients that vanish per stage (``{"mask": 2}``; stage ``"input"`` for the plain sum),
        drawn with ``seed``. Heads are fitted from the survivors' total.
    progress : bool, default False
        Passed to heads that take a ``progress`` parameter.

    Returns
    -------
    SimulationResult

    Raises
    ------
    UnsupportedModeError
        A head needs a richer upload mode than ``mode`` (raised before any work).
    ConfigError, InputError
        Invalid parameters or data.
    AggregationAbortedError
        The protocol aborted (too few clients remained).
    """
    names = parse_head_list(list(heads) if not isinstance(heads, str) else heads)
    mode = _check_mode(mode)
    class_names = _class_names(classes)
    seed = _check_seed(seed)
    models = build_heads(names, head_params, seed=seed, progress=progress, mode=mode)
    c = len(class_names)
    xtr, ytr = check_labelled_embeddings(x_train, y_train, c, "training")
    xte, yte = check_labelled_embeddings(x_test, y_test, c, "test")
    if xte.shape[1] != xtr.shape[1]:
        raise InputError(
            f"test embeddings have d={xte.shape[1]} but training embeddings have "
            f"d={xtr.shape[1]}; embed both with the same encoder"
        )
    if yte.size == 0:
        raise InputError("the test set is empty; accuracy needs at least one test sample")
    projection = _projection(projection_dim, projection_seed, xtr.shape[1])
    if encoder is not None and encoder.dim != xtr.shape[1]:
        raise InputError(
            f"encoder {encoder.name!r} declares d={encoder.dim} but the embeddings have "
            f"d={xtr.shape[1]}; pass the EncoderInfo of the encoder that produced them"
        )

    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    parts = dirichlet_partition(ytr, clients, alpha, seed, min_per_client=min_per_client)
    stages["partition"] = time.perf_counter() - t0

    clip = _clip_norm(clip_norm, secure)
    ids = [f"client-{i:0{len(str(max(clients - 1, 1)))}d}" for i in range(clients)]
    client_seconds: list[float] = []

    def stats_of(idx: I64) -> Callable[[], ClientStats]:
        def make() -> ClientStats:  # each client sees only its own rows
            t = time.perf_counter()
            out = compute_stats(xtr[idx], ytr[idx], class_names, mode, encoder, projection,
                                clip_norm=clip)
            client_seconds.append(time.perf_counter() - t)
            return out
        return make

    meta = StatsAccumulator(class_names, xtr.shape[1], mode, encoder, projection,
                            clip_norm=clip).meta
    server: SecAggServer | PlainServer
    halves: list[SecAggClient] | list[PlainClient]
    if secure is not None:
        halves = [SecAggClient(cid, stats_of(idx), meta=meta)
                  for cid, idx in zip(ids, parts, strict=True)]
        server = SecAggServer(secure, meta, ids)
    else:
        halves = [PlainClient(cid, stats_of(idx)) for cid, idx in zip(ids, parts, strict=True)]
        server = PlainServer(ids, meta)
    t0 = time.perf_counter()
    report: AggregationReport = run_aggregation(server, InMemoryTransport(halves, drops,
                                                                          seed=seed))
    elapsed = time.perf_counter() - t0
    total = report.total
    stages["client_stats"] = float(sum(client_seconds))
    stages["client_stats_max"] = max(client_seconds, default=0.0)
    stages["aggregate"] = max(elapsed - stages["client_stats"], 0.0)

    results, preds = _fit_and_evaluate(models, total, xte, yte, stages)
    return SimulationResult(
        heads=results,
        clients=int(clients),
        alpha=float(alpha),
        seed=seed,
        mode=mode,
        projection_dim=None if projection is None else projection.dim,
        projection_seed=None if projection is None else projection.seed,
        upload_bytes_per_client=schema_for(mode).nbytes(c, meta.dim),
        n_train=int(ytr.size),
        n_test=int(yte.size),
        num_classes=c,
        classes=list(class_names),
        stage_seconds=stages,
        client_sizes=[int(p.size) for p in parts],
        aggregation=report.to_dict(),
        clip_norm=clip,
        n_clipped=total.n_clipped,
        predictions=preds,
    )


# ---------------------------------------------------------------------- heads, generically
def head_defaults(name: str) -> dict[str, Any]:
    """Default hyperparameters of the head registered as ``name`` (from its ``__init__``).

    Parameters without a default map to ``inspect.Parameter.empty``.
    """
    sig = inspect.signature(head_class(name).__init__)
    return {
        p.name: p.default
        for p in sig.parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def build_heads(
    names: Sequence[str],
    head_params: dict[str, dict[str, Any]] | None = None,
    *,
    seed: int | None = None,
    progress: bool = False,
    mode: Mode | None = None,
) -> dict[str, Head]:
    """Create (unfitted) heads by name, checking everything that can be checked before work.

    Parameters
    ----------
    names : sequence of str
        Registered head names.
    head_params : dict of str to dict, optional
        Hyperparameters per head: keys must be registered heads (entries for heads not in
        ``names`` are ignored, so one configuration can serve several head lists), values
        parameters those heads accept.
    seed : int, optional
        Given to every head with a ``seed`` parameter that ``head_params`` does not set.
    progress : bool, default False
        Given to every head with a ``progress`` parameter that ``head_params`` does not set.
    mode : {"full", "pooled", "diag"}, optional
        Upload mode the heads will be fitted from; a head needing more raises.

    Returns
    -------
    dict of str to Head
        In the order of ``names``.

    Raises
    ------
    UnsupportedModeError
        A head's ``min_mode`` is richer than ``mode``.
    ConfigError
        Unknown head, unknown parameter, or invalid parameter value.
    """
    params = dict(head_params or {})
    registered = available_heads()
    unknown_heads = [h for h in params if h not in registered]
    if unknown_heads:
        raise ConfigError(
            f"parameters were given for {unknown_heads[0]!r}, which is not a registered head; "
            f"available heads: {', '.join(registered)}"
        )
    out: dict[str, Head] = {}
    for name in names:
        cls = head_class(name)
        if mode is not None and not mode_supports(mode, cls.min_mode):
            raise UnsupportedModeError(
                f"head {name!r} needs upload mode {cls.min_mode!r} or richer, but the statistics "
                f"are mode {mode!r}; compute the client statistics with mode {cls.min_mode!r} "
                f"(--mode {cls.min_mode}) or drop {name!r} from the heads"
            )
        defaults = head_defaults(name)
        given = dict(params.get(name, {}))
        unknown = [k for k in given if k not in defaults]
        if unknown:
            valid = ", ".join(sorted(defaults)) or "(none)"
            raise ConfigError(
                f"head {name!r} has no parameter {unknown[0]!r}; valid parameters: {valid}"
            )
        if seed is not None and "seed" in defaults:
            given.setdefault("seed", seed)
        if "progress" in defaults:
            given.setdefault("progress", progress)
        head = make_head(name, **given)
        head._validate_params()  # the head's one declarative place for parameter checks
        out[name] = head
    return out


def _fit_and_evaluate(
    models: dict[str, Head], total: ClientStats, x_test: F64, y_test: I64,
    stages: dict[str, float],
) -> tuple[dict[str, HeadResult], dict[str, I64]]:
    results: dict[str, HeadResult] = {}
    preds: dict[str, I64] = {}
    for name, head in models.items():
        t0 = time.perf_counter()
        head.fit_from_stats(total)
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        pred = head.predict(x_test)
        pred_s = time.perf_counter() - t0
        stages[f"fit/{name}"] = fit_s
        stages[f"evaluate/{name}"] = pred_s
        preds[name] = pred
        results[name] = HeadResult(
            accuracy=float(np.mean(pred == y_test)),
            fit_seconds=fit_s,
            predict_seconds=pred_s,
            params=head.get_params(),
        )
    return results, preds


# ---------------------------------------------------------------------- validation
def check_labelled_embeddings(
    x: NDArray[Any], y: NDArray[Any], num_classes: int, what: str = "input",
    range_hint: str = "give the full class list (every class any client has)",
) -> tuple[F64, I64]:
    """Validate embeddings and labels; return them as float64 (n, d) and int64 (n,).

    Parameters
    ----------
    x : array_like, shape (n, d)
        Finite numeric embeddings.
    y : array_like of int, shape (n,)
        Labels in ``0..num_classes-1``.
    num_classes : int
    what : str
        Name used in messages, e.g. ``"training"``.
    range_hint : str
        The fix suggested when a label is out of range.

    Raises
    ------
    InputError
        Naming the problem (shape, dtype, NaN, label range) and the fix.
    """
    xa = np.asarray(x)
    ya = np.asarray(y)
    if xa.ndim != 2:
        raise InputError(f"{what} embeddings must be a 2-D array (n, d); got shape {xa.shape}")
    if xa.dtype.kind not in "fiu":
        raise InputError(f"{what} embeddings must be numeric; got dtype {xa.dtype}")
    if ya.ndim != 1 or ya.shape[0] != xa.shape[0]:
        raise InputError(
            f"{what} labels must have shape ({xa.shape[0]},) to match the embeddings; "
            f"got {ya.shape}"
        )
    x64: F64 = np.asarray(xa, dtype=np.float64)
    finite = np.isfinite(x64).all(axis=1)
    if not finite.all():
        raise InputError(
            f"{what} embeddings contain NaN or infinite values (first bad row "
            f"{int(np.flatnonzero(~finite)[0])}); fix the encoder output or drop those rows"
        )
    integral = ya.dtype.kind == "f" and np.all(np.isfinite(ya)) and np.all(ya == np.round(ya))
    if ya.size and ya.dtype.kind not in "iu" and not integral:
        raise InputError(f"{what} labels must be integers; got dtype {ya.dtype}")
    y64: I64 = ya.astype(np.int64)
    if y64.size and y64.min() < 0:
        raise InputError(
            f"{what} labels must be class indices 0..{num_classes - 1}; got the negative "
            f"label {int(y64.min())}"
        )
    if y64.size and y64.max() >= num_classes:
        raise InputError(
            f"{what} label {int(y64.max())} is out of range for {num_classes} classes "
            f"(0..{num_classes - 1}); {range_hint}"
        )
    return x64, y64


def _class_names(classes: int | Sequence[str]) -> tuple[str, ...]:
    if isinstance(classes, bool | str):
        raise ConfigError(
            f"classes must be a number or a sequence of names; got {classes!r}"
        )
    if isinstance(classes, int | np.integer):
        if classes < 1:
            raise ConfigError(f"classes must be >= 1 (or a list of names); got {classes}")
        return tuple(str(i) for i in range(int(classes)))
    names = tuple(str(c) for c in classes)
    if not names:
        raise ConfigError("classes must name at least one class; got an empty list")
    return names


def _check_mode(mode: str) -> Mode:
    try:
        return schema_for(mode).mode
    except StatsValidationError:
        raise ConfigError(f"mode must be one of {', '.join(SCHEMAS)}; got {mode!r}") from None


def _clip_norm(clip_norm: float | None, secure: SecAggConfig | None) -> float | None:
    if secure is None:
        return None if clip_norm is None else float(clip_norm)
    if clip_norm is not None and float(clip_norm) != float(secure.clip_norm):
        raise ConfigError(
            f"clip_norm={clip_norm:g} disagrees with the secure configuration's clipping bound "
            f"R={secure.clip_norm:g}; give one value"
        )
    return float(secure.clip_norm)


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer; got {seed!r}")
    return int(seed)


def _projection(dim: int | None, seed: int, input_dim: int) -> ProjectionSpec | None:
    if dim is None:
        return None
    if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 1:
        raise ConfigError(f"projection_dim must be an integer >= 1; got {dim!r}")
    return ProjectionSpec(int(seed), input_dim, int(dim))


def to_jsonable(v: Any) -> Any:
    """Hyperparameter values as JSON types (numpy scalars unwrapped, others as strings)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [to_jsonable(i) for i in v]
    if isinstance(v, dict):
        return {str(k): to_jsonable(i) for k, i in v.items()}
    return str(v)
