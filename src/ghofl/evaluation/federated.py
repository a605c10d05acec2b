"""Federated evaluation: every client scores the heads on its own held-out rows, sends sums.

A client never uploads a prediction or a per-client metric. Per head it computes, on its own
held-out split, only additive quantities (:class:`HeadSums`):

* the confusion counts ``confusion[t, p]`` (C, C), int64: rows of true class t predicted p;
* the log-loss sum Σ −log p̂(y|x), each probability clipped to [ε, 1 − ε] with ε the float64
  machine epsilon, exactly as :func:`sklearn.metrics.log_loss` clips;
* a reliability histogram of :data:`DEFAULT_BINS` (public) equal-width confidence bins on
  [0, 1]: per bin the number of rows, the sum of their confidences (the largest predicted
  probability) and the number predicted correctly; a confidence q falls in bin
  ``min(floor(q · B), B − 1)``;
* the client's accuracy a and its square a², so that the server learns the mean and the spread
  of accuracy over clients without any one client's accuracy.

Once per evaluation (not per head), when the model holds an OOD score (:mod:`ghofl.heads.ood`):
the histogram ``ood_counts`` (int64, :data:`~ghofl.heads.ood.HIST_BINS` bins) of the OOD scores
of the held-out rows over the public edges :func:`~ghofl.heads.ood.score_bin_edges` (log-spaced
multiples of the statistics dimension k). Its total calibrates the model's OOD threshold
(:func:`calibrate_ood`, :meth:`~ghofl.heads.ood.MahalanobisOOD.calibrate_from_histogram`)
without any row or score leaving its client.

:class:`EvaluationSums` holds these per head plus the number of clients; ``+`` (and
:func:`sum`) adds them, and :func:`report` turns a total into per-head metrics: accuracy,
balanced accuracy (mean recall over the classes with held-out rows), macro-F1 (mean over the
classes that are true or predicted somewhere, as scikit-learn's ``f1_score(average="macro")``),
log-loss, expected calibration error ECE = Σ_b |correct_b − confidence_b| / n, and the mean ±
standard deviation (population, ddof = 0) of client accuracy. Every metric but the client
spread depends on the union of the held-out rows only, not on how they are split into clients.

Files (``.ghe``) are JSON: ``{"format": "ghofl.evaluation", "format_version": 2, "classes",
"bins", "clients", "heads": {NAME: {"confusion", "log_loss_sum", "bin_counts",
"bin_confidence_sum", "bin_correct", "client_accuracy_sum", "client_accuracy_sq_sum"}},
"ood_counts": [...] or null, "digest"}``; a version-1 file (written before ``ood_counts``)
reads as sums without the histogram. Floats are written with Python's shortest round-tripping
repr, so a file reads back bit for bit. ``digest`` is the SHA-256 of the canonical JSON
(sorted keys, compact) without the digest; a file that fails it, or holds values no client
could produce, is refused.

For secure aggregation the sums flatten to one int64 vector and one float64 vector
(:meth:`EvaluationSums.to_vectors`), each entry of one client bounded by public values
(:func:`vector_bounds`: M samples per client give counts ≤ M, log-loss sum ≤ M·(−log ε),
confidence sums ≤ M, accuracy and its square ≤ 1, OOD histogram counts ≤ M).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray
from scipy.special import logsumexp

from ghofl.data.embeddings import check_labelled_embeddings
from ghofl.errors import InputError
from ghofl.files import atomic_write
from ghofl.heads.base import Head
from ghofl.heads.ood import DEFAULT_FPR, HIST_BINS, MahalanobisOOD, score_histogram

__all__ = [
    "DEFAULT_BINS",
    "EVAL_FORMAT",
    "EVAL_FORMAT_VERSION",
    "LOG_LOSS_CAP",
    "EvaluationSums",
    "HeadSums",
    "calibrate_ood",
    "federated_ood_report",
    "load_evaluation",
    "local_evaluation",
    "report",
    "save_evaluation",
    "vector_bounds",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

#: Public number of equal-width confidence bins of the reliability histogram.
DEFAULT_BINS = 15
EVAL_FORMAT = "ghofl.evaluation"
EVAL_FORMAT_VERSION = 2
_READABLE_VERSIONS = (1, EVAL_FORMAT_VERSION)  # version 1: no ood_counts
_EPS = float(np.finfo(np.float64).eps)
_TINY = float(np.finfo(np.float64).tiny)
#: Largest per-row log-loss: −log ε once the probability is clipped to [ε, 1 − ε].
LOG_LOSS_CAP = -math.log(_EPS)
_SLACK = 1e-9  # float sums may exceed an exact bound by accumulated rounding
_FIX = "write it again with `ghofl evaluate MODEL --embeddings LOCAL.npz --local --out FILE`"


@dataclass(frozen=True, eq=False)
class HeadSums:
    """Additive evaluation sums of one head over the rows of one or more clients.

    Attributes
    ----------
    confusion : ndarray of int64, shape (C, C)
        ``confusion[t, p]``: rows of true class t predicted as class p.
    log_loss_sum : float
        Σ −log clip(p̂(y|x), ε, 1 − ε) over the rows.
    bin_counts : ndarray of int64, shape (B,)
        Rows per confidence bin.
    bin_confidence_sum : ndarray of float64, shape (B,)
        Sum of the rows' confidences (largest predicted probability) per bin.
    bin_correct : ndarray of int64, shape (B,)
        Rows predicted correctly per bin.
    client_accuracy_sum, client_accuracy_sq_sum : float
        Σ over clients of each client's accuracy, and of its square.
    """

    confusion: I64
    log_loss_sum: float
    bin_counts: I64
    bin_confidence_sum: F64
    bin_correct: I64
    client_accuracy_sum: float
    client_accuracy_sq_sum: float

    @property
    def n(self) -> int:
        """Number of rows scored."""
        return int(self.confusion.sum())

    def check(self, num_classes: int, bins: int, clients: int, where: str) -> None:
        """Refuse shapes, dtypes or values that no sum of clients' evaluations can have.

        Raises
        ------
        InputError
            Naming the entry, what was expected and where.
        """
        shapes = {"confusion": (num_classes, num_classes), "bin_counts": (bins,),
                  "bin_confidence_sum": (bins,), "bin_correct": (bins,)}
        for name, shape in shapes.items():
            arr = getattr(self, name)
            kind = "f" if name == "bin_confidence_sum" else "i"
            if not isinstance(arr, np.ndarray) or arr.shape != shape or arr.dtype.kind != kind:
                got = (f"{arr.dtype} of shape {arr.shape}" if isinstance(arr, np.ndarray)
                       else type(arr).__name__)
                raise InputError(f"{where}: {name} must be {'float' if kind == 'f' else 'int'}"
                                 f" of shape {shape}; got {got}")
        n, conf = self.n, self.bin_confidence_sum
        scalars = (self.log_loss_sum, self.client_accuracy_sum, self.client_accuracy_sq_sum)
        ok = (all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in scalars)
              and bool(np.all(self.confusion >= 0) and np.all(self.bin_correct >= 0)
                       and np.all(self.bin_correct <= self.bin_counts))
              and int(self.bin_counts.sum()) == n
              and int(self.bin_correct.sum()) == int(np.trace(self.confusion))
              and bool(np.all(np.isfinite(conf)) and np.all(conf >= 0)
                       and np.all(conf <= self.bin_counts * (1 + _SLACK)))
              and self.log_loss_sum <= n * LOG_LOSS_CAP * (1 + _SLACK)
              and self.client_accuracy_sum <= clients * (1 + _SLACK)
              and self.client_accuracy_sq_sum <= self.client_accuracy_sum * (1 + _SLACK))
        if not ok:
            raise InputError(
                f"{where} holds sums no clients' evaluation can produce (negative or non-finite "
                "values, bins that do not add up to the confusion counts, or accuracy sums "
                "beyond the number of clients); the file is corrupt or was edited"
            )

    def __add__(self, other: HeadSums) -> HeadSums:
        return HeadSums(self.confusion + other.confusion,
                        self.log_loss_sum + other.log_loss_sum,
                        self.bin_counts + other.bin_counts,
                        self.bin_confidence_sum + other.bin_confidence_sum,
                        self.bin_correct + other.bin_correct,
                        self.client_accuracy_sum + other.client_accuracy_sum,
                        self.client_accuracy_sq_sum + other.client_accuracy_sq_sum)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (lists and floats)."""
        return {"confusion": self.confusion.tolist(), "log_loss_sum": self.log_loss_sum,
                "bin_counts": self.bin_counts.tolist(),
                "bin_confidence_sum": [float(v) for v in self.bin_confidence_sum],
                "bin_correct": self.bin_correct.tolist(),
                "client_accuracy_sum": self.client_accuracy_sum,
                "client_accuracy_sq_sum": self.client_accuracy_sq_sum}


@dataclass(frozen=True, eq=False)
class EvaluationSums:
    """Per-head evaluation sums of a set of clients; ``a + b`` is the sums of both sets.

    Attributes
    ----------
    classes : tuple of str, length C
    heads : dict of str to HeadSums
    clients : int
        Number of clients whose held-out rows are in the sums.
    bins : int, default :data:`DEFAULT_BINS`
        Number of confidence bins (public, the same for every client).
    ood_counts : ndarray of int64, shape (HIST_BINS,), optional
        Held-out rows per OOD score bin (:func:`~ghofl.heads.ood.score_histogram`); ``None``
        when the model holds no OOD score.
    """

    classes: tuple[str, ...]
    heads: dict[str, HeadSums] = field(repr=False)
    clients: int
    bins: int = DEFAULT_BINS
    ood_counts: I64 | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.bins, int) or self.bins < 1:
            raise InputError(f"the number of confidence bins must be an integer >= 1; got "
                             f"{self.bins!r}")
        if not isinstance(self.clients, int) or self.clients < 0:
            raise InputError(f"the number of clients must be an integer >= 0; got "
                             f"{self.clients!r}")
        if not self.heads:
            raise InputError("evaluation sums need at least one head; got none")
        for name, sums in self.heads.items():
            sums.check(len(self.classes), self.bins, self.clients, f"the sums of head {name!r}")
        self._check_ood_counts()

    def _check_ood_counts(self) -> None:
        h = self.ood_counts
        if h is None:
            return
        n = next(iter(self.heads.values())).n
        if not isinstance(h, np.ndarray) or h.shape != (HIST_BINS,) or h.dtype.kind not in "iu" \
                or bool(np.any(h < 0)) or int(h.sum()) != n:
            got = (f"{h.dtype} of shape {h.shape} summing to {int(h.sum())}"
                   if isinstance(h, np.ndarray) else type(h).__name__)
            raise InputError(f"the OOD score histogram must be {HIST_BINS} non-negative integer "
                             f"counts summing to the {n} rows scored; got {got}; the file is "
                             "corrupt or was edited")

    def __add__(self, other: EvaluationSums) -> EvaluationSums:
        if not isinstance(other, EvaluationSums):
            return NotImplemented
        if other.classes != self.classes or other.bins != self.bins:
            raise InputError(
                "cannot add evaluation sums of different classes or confidence bins "
                f"({len(self.classes)} classes, {self.bins} bins vs {len(other.classes)} "
                f"classes, {other.bins} bins); evaluate every client with the same model"
            )
        if list(other.heads) != list(self.heads):
            raise InputError(
                f"cannot add evaluation sums of heads {', '.join(self.heads)} and "
                f"{', '.join(other.heads)}; evaluate every client with the same model"
            )
        if (self.ood_counts is None) != (other.ood_counts is None):
            raise InputError("cannot add evaluation sums with and without an OOD score "
                             "histogram; evaluate every client with the same model directory "
                             "(evaluate --local, which counts the scores when the model has one)")
        ood = None if self.ood_counts is None or other.ood_counts is None \
            else self.ood_counts + other.ood_counts
        return EvaluationSums(self.classes,
                              {k: v + other.heads[k] for k, v in self.heads.items()},
                              self.clients + other.clients, self.bins, ood)

    def __radd__(self, other: object) -> EvaluationSums:
        if isinstance(other, int) and other == 0:  # sum() starts from 0
            return self
        return NotImplemented

    def to_dict(self) -> dict[str, Any]:
        """The file's content without the digest."""
        return {"format": EVAL_FORMAT, "format_version": EVAL_FORMAT_VERSION,
                "classes": list(self.classes), "bins": self.bins, "clients": self.clients,
                "heads": {k: v.to_dict() for k, v in self.heads.items()},
                "ood_counts": None if self.ood_counts is None else self.ood_counts.tolist()}

    def to_vectors(self) -> tuple[I64, F64]:
        """The sums as one int64 and one float64 vector (secure aggregation's input).

        Per head, in order: ints = confusion (C·C), bin_counts (B), bin_correct (B); floats =
        log_loss_sum, bin_confidence_sum (B), client_accuracy_sum, client_accuracy_sq_sum.
        After the heads' ints come the ``ood_counts`` (HIST_BINS) when present; the ints end
        with ``clients``. :meth:`from_vectors` inverts it.
        """
        ints = [np.concatenate([h.confusion.ravel(), h.bin_counts, h.bin_correct])
                for h in self.heads.values()]
        if self.ood_counts is not None:
            ints.append(self.ood_counts)
        floats = [np.concatenate([[h.log_loss_sum], h.bin_confidence_sum,
                                  [h.client_accuracy_sum, h.client_accuracy_sq_sum]])
                  for h in self.heads.values()]
        return (np.concatenate([*ints, [self.clients]]).astype(np.int64),
                np.concatenate(floats).astype(np.float64))

    @classmethod
    def from_vectors(cls, classes: tuple[str, ...], heads: tuple[str, ...], bins: int,
                     ints: I64, floats: F64) -> EvaluationSums:
        """Inverse of :meth:`to_vectors` (the layout is fixed by classes, heads and bins).

        The OOD histogram is there when ``ints`` is HIST_BINS longer than the heads' layout.
        """
        c, b = len(classes), bins
        ni, nf = c * c + 2 * b, b + 3
        base = ni * len(heads) + 1
        if ints.shape not in ((base,), (base + HIST_BINS,)) or floats.shape != (nf * len(heads),):
            raise InputError(f"evaluation vectors of shapes {ints.shape} and {floats.shape} do "
                             f"not match {len(heads)} heads, {c} classes and {b} bins (with or "
                             f"without the {HIST_BINS} OOD score bins)")
        ood = ints[base - 1:-1].astype(np.int64) if ints.shape[0] > base else None
        out: dict[str, HeadSums] = {}
        for k, name in enumerate(heads):
            i, f = ints[k * ni:(k + 1) * ni].astype(np.int64), floats[k * nf:(k + 1) * nf]
            out[name] = HeadSums(i[:c * c].reshape(c, c).copy(), float(f[0]),
                                 i[c * c:c * c + b].copy(), f[1:1 + b].astype(np.float64),
                                 i[c * c + b:].copy(), float(f[b + 1]), float(f[b + 2]))
        return cls(tuple(classes), out, int(ints[-1]), bins, ood)


def vector_bounds(sums: EvaluationSums, max_samples: int) -> tuple[I64, F64]:
    """Public bounds of one client's :meth:`EvaluationSums.to_vectors` entries.

    Parameters
    ----------
    sums : EvaluationSums
        Any sums of the federation (only its layout is used).
    max_samples : int
        M, the public maximum number of held-out rows per client.

    Returns
    -------
    ints : ndarray of int64, same shape as the int vector
    floats : ndarray of float64, same shape as the float vector
    """
    b = sums.bins
    c2 = len(sums.classes) ** 2
    per_int = np.full(c2 + 2 * b, max_samples, dtype=np.int64)
    per_float = np.concatenate([[max_samples * LOG_LOSS_CAP], np.full(b, float(max_samples)),
                                [1.0, 1.0]])
    k = len(sums.heads)
    hist = np.full(0 if sums.ood_counts is None else HIST_BINS, max_samples, dtype=np.int64)
    return (np.concatenate([np.tile(per_int, k), hist, [1]]).astype(np.int64),
            np.tile(per_float, k).astype(np.float64))


class _ScoresHeads(Protocol):
    """A fitted model (:class:`~ghofl.model.directory.FittedModel`): heads and features."""

    @property
    def heads(self) -> dict[str, Head]: ...

    def features(self, x: NDArray[Any], transform: str | None = None) -> F64: ...


def local_evaluation(model_or_heads: Mapping[str, Head] | _ScoresHeads, x: NDArray[Any],
                     y: NDArray[Any], *, bins: int = DEFAULT_BINS,
                     transform: str | None = None, what: str = "held-out",
                     ood: MahalanobisOOD | None = None) -> EvaluationSums:
    """One client's evaluation sums of every head on its held-out rows.

    Parameters
    ----------
    model_or_heads : FittedModel or mapping of str to Head
        A model directory as loaded (its recorded feature transform is applied to ``x``) or
        fitted heads (``x`` already in their input space), all on the same classes.
    x : array_like, shape (n, d)
    y : array_like of int, shape (n,)
        True class indices.
    bins : int, default :data:`DEFAULT_BINS`
    transform : str, optional
        With a model: the transform to apply instead of the recorded one.
    what : str
        The data, as messages name it.
    ood : MahalanobisOOD, optional
        The model's OOD score (:func:`~ghofl.model.directory.load_ood`): the sums carry the
        histogram of the rows' scores (after the heads' projection, as ``predict`` scores).

    Returns
    -------
    EvaluationSums
        With ``clients == 1``.

    Raises
    ------
    InputError
        No rows, malformed rows or labels, or heads fitted on different classes.
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise InputError(f"the number of confidence bins must be an integer >= 1; got {bins!r}")
    if isinstance(model_or_heads, Mapping):
        heads, z = dict(model_or_heads), np.asarray(x, dtype=np.float64)
    else:
        heads, z = dict(model_or_heads.heads), model_or_heads.features(x, transform)
    if not heads:
        raise InputError("local evaluation needs at least one fitted head; got none")
    first = next(iter(heads.values()))
    first._check_fitted()
    classes = tuple(first.meta_.classes)
    for name, head in heads.items():
        head._check_fitted()
        if tuple(head.meta_.classes) != classes:
            raise InputError(f"head {name!r} was fitted on other classes than the first head; "
                             "evaluate heads fitted from the same statistics together")
    zz, yy = check_labelled_embeddings(z, y, len(classes), what,
                                       range_hint="the heads do not know that class")
    if yy.size == 0:
        raise InputError(f"the {what} set is empty; a client's evaluation needs at least one "
                         "held-out row")
    out = {name: _head_sums(head, zz, yy, bins) for name, head in heads.items()}
    hist = None
    if ood is not None:
        proj = first.meta_.projection
        hist = score_histogram(ood.score(proj.apply(zz) if proj is not None else zz),
                               ood.bin_edges())
    return EvaluationSums(classes, out, 1, bins, hist)


def calibrate_ood(total: EvaluationSums, ood: MahalanobisOOD,
                  fpr: float = DEFAULT_FPR) -> MahalanobisOOD:
    """Set the threshold of ``ood`` from the OOD histogram of ``total`` (calibration "federated").

    :meth:`~ghofl.heads.ood.MahalanobisOOD.calibrate_from_histogram` of ``total.ood_counts``
    over ``ood``'s public edges; ``ood`` must be the score the clients evaluated with.

    Raises
    ------
    InputError
        ``total`` carries no histogram, or too few rows for ``fpr``.
    """
    if total.ood_counts is None:
        raise InputError("these evaluation sums carry no OOD score histogram (the clients "
                         "evaluated a model without an OOD score, or wrote them with an older "
                         "ghofl); have every client run `ghofl evaluate MODEL --local` again")
    return ood.calibrate_from_histogram(total.ood_counts, ood.bin_edges(), fpr)


def _head_sums(head: Head, z: F64, y: I64, bins: int) -> HeadSums:
    """The sums of one head on rows z (n, d) with labels y (n,)."""
    scores = head.class_scores(z)
    pred = np.argmax(scores, axis=1)
    log_p = scores - logsumexp(scores, axis=1, keepdims=True)
    proba = np.exp(log_p)
    proba[(proba < _TINY) & (log_p > -np.inf)] = _TINY  # as Head.predict_proba
    rows = np.arange(y.size)
    c = scores.shape[1]
    confusion = np.zeros((c, c), dtype=np.int64)
    np.add.at(confusion, (y, pred), 1)
    loss = float(np.sum(-np.log(np.clip(proba[rows, y], _EPS, 1.0 - _EPS))))
    conf = proba[rows, pred]
    which = np.minimum((conf * bins).astype(np.int64), bins - 1)
    correct = (pred == y).astype(np.int64)
    acc = float(correct.mean())
    return HeadSums(confusion, loss, np.bincount(which, minlength=bins).astype(np.int64),
                    np.bincount(which, weights=conf, minlength=bins).astype(np.float64),
                    np.bincount(which, weights=correct, minlength=bins).astype(np.int64),
                    acc, acc * acc)


def report(sums: EvaluationSums) -> dict[str, dict[str, Any]]:
    """Per-head metrics of a total of evaluation sums.

    Returns
    -------
    dict of str to dict
        Per head: ``accuracy``, ``balanced_accuracy``, ``macro_f1``, ``log_loss``, ``ece``,
        ``client_accuracy_mean``, ``client_accuracy_std`` (``None`` without clients), ``n``
        and ``clients``. Metrics of an empty total are ``None``.
    """
    return {name: _metrics(h, sums.clients) for name, h in sums.heads.items()}


def _metrics(h: HeadSums, clients: int) -> dict[str, Any]:
    n = h.n
    out: dict[str, Any] = {"n": n, "clients": clients}
    if n == 0:
        return {**out, **dict.fromkeys(("accuracy", "balanced_accuracy", "macro_f1", "log_loss",
                                        "ece", "client_accuracy_mean", "client_accuracy_std"))}
    cm = h.confusion
    tp = np.diag(cm).astype(np.float64)
    support, predicted = cm.sum(axis=1), cm.sum(axis=0)
    present = support > 0
    seen = present | (predicted > 0)
    f1 = 2 * tp[seen] / (support[seen] + predicted[seen])
    mean = h.client_accuracy_sum / clients if clients else None
    std = (math.sqrt(max(h.client_accuracy_sq_sum / clients - mean * mean, 0.0))
           if mean is not None else None)
    return {**out, "accuracy": float(tp.sum() / n),
            "balanced_accuracy": float(np.mean(tp[present] / support[present])),
            "macro_f1": float(np.mean(f1)), "log_loss": h.log_loss_sum / n,
            "ece": float(np.sum(np.abs(h.bin_correct - h.bin_confidence_sum)) / n),
            "client_accuracy_mean": mean, "client_accuracy_std": std}


def federated_ood_report(total: EvaluationSums, ood: MahalanobisOOD | None,
                         fpr: float = DEFAULT_FPR) -> dict[str, Any] | None:
    """The OOD threshold calibrated from ``total``'s histogram, as a report (sets ``ood``'s).

    Returns
    -------
    dict or None
        ``None`` without an OOD score; else ``calibration`` (``"federated"``), ``threshold``,
        ``fpr``, ``n`` and ``held_out_flagged`` (share of the held-out rows in the bins above
        the threshold, at most ``fpr``), or, when the rows do not suffice for the rate,
        ``calibration`` ``"none"`` and ``reason``.
    """
    if ood is None:
        return None
    try:
        calibrate_ood(total, ood, fpr)
    except InputError as exc:
        return {"calibration": "none", "fpr": fpr, "reason": str(exc)}
    assert total.ood_counts is not None and ood.threshold_ is not None
    above = int(np.searchsorted(ood.bin_edges(), ood.threshold_, side="right"))
    n = int(total.ood_counts.sum())
    return {"calibration": "federated", "threshold": ood.threshold_, "fpr": fpr, "n": n,
            "held_out_flagged": int(total.ood_counts[above:].sum()) / n}


# ---------------------------------------------------------------------- files
def _digest(body: Mapping[str, Any]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def save_evaluation(path: str | os.PathLike[str], sums: EvaluationSums) -> Path:
    """Write ``sums`` to a ``.ghe`` file atomically (see the module docstring)."""
    body = sums.to_dict()
    text = json.dumps({**body, "digest": _digest(body)}, indent=1, allow_nan=False) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return Path(path)


def load_evaluation(path: str | os.PathLike[str]) -> EvaluationSums:
    """Read a ``.ghe`` file written by :func:`save_evaluation`.

    Raises
    ------
    InputError
        The file is not an evaluation file of this format version, its digest does not match
        its content, or it holds sums no clients' evaluation can produce.
    """
    p = Path(path)
    where = f"'{p}'"
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{where} is not an evaluation file (not JSON: {exc}); {_FIX}") from exc
    if not isinstance(raw, dict) or raw.get("format") != EVAL_FORMAT:
        raise InputError(f"{where} is not a ghofl evaluation file (no format "
                         f"{EVAL_FORMAT!r}); {_FIX}")
    version = raw.get("format_version")
    if isinstance(version, bool) or version not in _READABLE_VERSIONS:
        raise InputError(f"{where} has evaluation format version {version!r}; this ghofl reads "
                         f"versions {', '.join(map(str, _READABLE_VERSIONS))}; {_FIX}")
    body = {k: v for k, v in raw.items() if k != "digest"}
    if raw.get("digest") != _digest(body):
        raise InputError(f"{where} does not match its digest: it was edited or is corrupt; "
                         f"{_FIX}")
    try:
        heads = {str(k): _head_from_dict(v) for k, v in raw["heads"].items()}
        hist = None if version == 1 or raw["ood_counts"] is None \
            else _int_array(raw["ood_counts"], "ood_counts")
        return EvaluationSums(tuple(str(c) for c in raw["classes"]), heads,
                              raw["clients"], raw["bins"], hist)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, InputError):
            raise InputError(f"{where}: {exc}") from exc
        raise InputError(f"{where} has a malformed field ({type(exc).__name__}: {exc}); "
                         f"{_FIX}") from exc


def _int_array(value: Any, key: str) -> I64:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{key} holds non-integers")
    return arr.astype(np.int64)


def _head_from_dict(d: Mapping[str, Any]) -> HeadSums:
    def ints(key: str) -> I64:
        return _int_array(d[key], key)

    def number(key: str) -> float:
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"{key} is not a number")
        return float(v)

    conf = np.asarray(d["bin_confidence_sum"], dtype=np.float64)
    return HeadSums(ints("confusion"), number("log_loss_sum"), ints("bin_counts"), conf,
                    ints("bin_correct"), number("client_accuracy_sum"),
                    number("client_accuracy_sq_sum"))
