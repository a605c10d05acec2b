"""The server half of a one-shot federation: aggregate → fitted heads → model directory, scores.

:class:`ServerJob` says which heads to fit and how (it travels in a run config under the keys of
:data:`~ghofl.server.fields.FIELDS`, :func:`ghofl.server.config.plan_to_config`);
:func:`run_server_job` is the one server function that ``ghofl fit``, the in-process simulator
and the Flower ServerApp all call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.data.embeddings import check_labelled_embeddings
from ghofl.errors import ConfigError, InputError, StatsValidationError
from ghofl.evaluation import HeadScore, evaluate_heads
from ghofl.heads.base import Head
from ghofl.heads.build import build_heads, check_heads_mode, to_jsonable
from ghofl.heads.ood import MahalanobisOOD
from ghofl.heads.preflight import preflight
from ghofl.heads.presets import check_preset, merge_preset
from ghofl.heads.registry import parse_head_list
from ghofl.model.directory import check_model_target, save_model
from ghofl.moments.core import compute_moments
from ghofl.server.default_head import choose_default_head
from ghofl.server.fields import FIELDS
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import Mode

__all__ = ["ServerJob", "ServerResult", "run_server_job"]


@dataclass(frozen=True)
class ServerJob:
    """Which heads the server fits from the total, with which hyperparameters.

    Every default is that of :data:`~ghofl.server.fields.FIELDS` (``docs/file-formats.md``).

    Attributes
    ----------
    heads : tuple of str
        Registered head names (a ``"nb,lda"`` string or ``"all"`` is accepted too).
    head_params : dict of str to dict
        Hyperparameters per head, e.g. ``{"lda": {"shrinkage": "auto"}}``; entries for
        registered heads not in ``heads`` are ignored.
    seed : int
        Given to every head with a ``seed`` parameter that ``head_params`` does not set.
    progress : bool
        Given to every head with a ``progress`` parameter that ``head_params`` does not set.
    preset : str
        Named head hyperparameters (:mod:`ghofl.heads.presets`), e.g. ``"paper"``; the
        entries of ``head_params`` override it key by key (:meth:`resolved_params`).

    Notes
    -----
    Construction checks everything that can be checked without statistics (head names,
    parameter names and values); the upload mode is checked by :func:`run_server_job`.
    """

    heads: tuple[str, ...] = field(default=FIELDS["server.heads"].default)
    head_params: dict[str, dict[str, Any]] = field(
        default_factory=lambda: dict(FIELDS["server.head_params"].default))
    seed: int = field(default=FIELDS["server.seed"].default)
    progress: bool = field(default=FIELDS["server.progress"].default)
    preset: str = field(default=FIELDS["server.preset"].default)
    _checked: dict[str, Head] | None = field(default=None, init=False, repr=False,
                                              compare=False)

    def __post_init__(self) -> None:
        raw = self.heads
        names = parse_head_list(raw if isinstance(raw, str) else [str(h) for h in raw])
        object.__setattr__(self, "heads", tuple(names))
        params = self.head_params
        if not isinstance(params, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Mapping) for k, v in params.items()
        ):
            raise ConfigError(
                "ServerJob head_params must map head names to dicts of parameters, e.g. "
                f"{{'lda': {{'shrinkage': 0.1}}}}; got {params!r}"
            )
        object.__setattr__(self, "head_params", {k: dict(v) for k, v in params.items()})
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ConfigError(f"seed must be a non-negative integer; got {seed!r}")
        object.__setattr__(self, "seed", int(seed))
        if not isinstance(self.progress, bool):
            raise ConfigError(f"ServerJob progress must be true or false; got {self.progress!r}")
        check_preset(self.preset)
        object.__setattr__(self, "_checked", build_heads(
            self.heads, self.resolved_params(), seed=self.seed, progress=self.progress))

    def build_heads(self, mode: Mode | None = None) -> dict[str, Head]:
        """The job's heads, unfitted, in the order of :attr:`heads`.

        The first call hands over the heads that construction built to check the job (so a
        run builds them once); a later call builds new ones. Not thread-safe: two threads
        running one job at once must each build their own (:func:`~ghofl.heads.build.
        build_heads`).

        Parameters
        ----------
        mode : {"full", "pooled", "gram", "diag", "means"}, optional
            Upload mode the heads will be fitted from.

        Raises
        ------
        UnsupportedModeError
            A head needs a richer upload mode than ``mode``.
        """
        if mode is not None:
            check_heads_mode(self.heads, mode)
        checked, built = self._checked, None
        if checked is not None:
            object.__setattr__(self, "_checked", None)
            built = checked
        return built if built is not None else build_heads(
            self.heads, self.resolved_params(), seed=self.seed, progress=self.progress)

    def resolved_params(self) -> dict[str, dict[str, Any]]:
        """The hyperparameters the heads are built with.

        The preset's values, overridden key by key by :attr:`head_params`
        (:func:`~ghofl.heads.presets.merge_preset`).
        """
        return merge_preset(self.preset, self.heads, self.head_params)


@dataclass(frozen=True)
class ServerResult:
    """What :func:`run_server_job` produced.

    Attributes
    ----------
    heads : dict of str to Head
        The fitted heads, in the job's order.
    fit_seconds : dict of str to float
        Server time to fit each head from the total.
    scores : dict of str to HeadScore or None
        Test scores per head, when a test set was given.
    model_dir : Path or None
        The model directory written, when ``out_dir`` was given.
    """

    heads: dict[str, Head]
    fit_seconds: dict[str, float]
    scores: dict[str, HeadScore] | None
    model_dir: Path | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (no arrays).

        ``{"heads": {NAME: {"fit_seconds", "params"[, "accuracy", "n", "predict_seconds"]}},
        "model_dir": str or None, "ghofl_version": str}``; the score keys are present when a
        test set was scored.
        """
        from ghofl import __version__

        heads: dict[str, Any] = {}
        for name, head in self.heads.items():
            entry: dict[str, Any] = {"fit_seconds": self.fit_seconds[name],
                                     "params": to_jsonable(head.get_params())}
            if self.scores is not None and name in self.scores:
                entry.update(self.scores[name].to_dict())
            heads[name] = entry
        return {
            "heads": heads,
            "model_dir": None if self.model_dir is None else str(self.model_dir),
            "ghofl_version": __version__,
        }


def run_server_job(
    total: ClientStats,
    job: ServerJob,
    *,
    out_dir: Path | None = None,
    test: tuple[NDArray[Any], NDArray[Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
    option: str = "out_dir",
    command: str | None = None,
    heads: Mapping[str, Head] | None = None,
) -> ServerResult:
    """Fit every head of ``job`` from the aggregate; save and score them when asked.

    Parameters
    ----------
    total : ClientStats
        The sum of the clients' statistics.
    job : ServerJob
        Heads and hyperparameters.
    out_dir : Path, optional
        Write the model directory here (atomically: complete or absent).
    test : pair (x (n, d), y (n,)), optional
        Labelled test embeddings to score every head on (inputs of the clients' space,
        before any projection).
    extra : mapping, optional
        Extra manifest entries (see :func:`~ghofl.model.directory.save_model`); the manifest's
        ``stats`` always records ``n_samples`` and ``counts`` of ``total``, and the manifest
        the default head (:func:`~ghofl.server.default_head.choose_default_head`) unless
        ``extra`` names one.
    log : callable, optional
        Receives a line before each head is fitted (e.g. ``"fitting lda..."``).
    option : str, default "out_dir"
        What named ``out_dir``, for messages.
    command : str, optional
        The command line that reproduces the model, for its model card.
    heads : mapping of str to Head, optional
        The job's heads, unfitted, as :func:`~ghofl.heads.build.build_heads` built them from
        the job (e.g. to check them before any client worked); default: built here.

    Returns
    -------
    ServerResult

    Raises
    ------
    UnsupportedModeError
        A head needs a richer upload mode than ``total`` (raised before any fitting).
    ConfigError
        ``heads`` are not the job's heads.
    InputError
        ``out_dir`` may not be replaced, or the test set is malformed, empty or of another
        dimension (raised before any fitting).

    Warns
    -----
    ResourceEstimateWarning
        A head's estimated memory or time is beyond the machine
        (:func:`ghofl.heads.preflight.preflight`, before any fitting).
    """
    if heads is not None and list(heads) != list(job.heads):
        raise ConfigError(f"heads {list(heads)} are not the job's heads {list(job.heads)}; "
                          "build them from the job (ghofl.heads.build.build_heads)")
    if heads is not None:
        check_heads_mode(job.heads, total.mode)
    models = dict(heads) if heads is not None else job.build_heads(total.mode)
    if test is not None:
        _check_test(test, total)
    if out_dir is not None:
        check_model_target(Path(out_dir), option)
    preflight(models, total.mode, total.num_classes, total.dim,  # warns when beyond the machine
              min_count=int(total.counts.min()) if total.num_classes else None)
    fit_seconds: dict[str, float] = {}
    for name, head in models.items():
        if log is not None:
            log(f"fitting {name}...")
        t0 = time.perf_counter()
        head.fit_from_stats(total)
        fit_seconds[name] = time.perf_counter() - t0
    # scored before saving, so that the model card reports the accuracies
    scores = None if test is None else evaluate_heads(models, test[0], test[1])
    model_dir = None
    if out_dir is not None:
        stats = {"n_samples": total.n_samples, "counts": total.counts.tolist(),
                 "n_clipped": total.n_clipped}
        extras = dict(extra or {})
        given = extras.pop("stats", None) or {}
        if "default_head" not in extras:
            extras["default_head"], extras["default_head_rule"] = choose_default_head(
                total, models, job.resolved_params(), job.seed)
        model_dir = save_model(Path(out_dir), models, stats_meta=total.meta,
                               extra={"stats": {**stats, **dict(given)}, **extras},
                               fit_seconds=fit_seconds, option=option, ood=_fit_ood(total),
                               scores=None if scores is None else
                               {n: sc.to_dict() for n, sc in scores.items()},
                               command=command)
    return ServerResult(models, fit_seconds, scores, model_dir)


def _fit_ood(total: ClientStats) -> MahalanobisOOD | None:
    """The model's out-of-distribution score, or ``None`` when the statistics give none.

    They give none with no more samples than classes, or a degenerate covariance.
    """
    try:
        return MahalanobisOOD().fit_from_moments(compute_moments(total))
    except StatsValidationError:
        return None


def _check_test(test: tuple[NDArray[Any], NDArray[Any]], total: ClientStats) -> None:
    if not isinstance(test, tuple) or len(test) != 2:
        raise InputError("test must be a pair (x, y) of test embeddings and labels")
    x, y = check_labelled_embeddings(test[0], test[1], total.num_classes, "test",
                                     range_hint="the heads do not know that class")
    if y.size == 0:
        raise InputError("the test set is empty; accuracy needs at least one test sample")
    proj = total.meta.projection
    d = proj.input_dim if proj is not None else total.dim
    if x.shape[1] != d:
        raise InputError(
            f"test embeddings have d={x.shape[1]} but the statistics were computed from "
            f"d={d}; embed the test set with the clients' encoder"
        )
