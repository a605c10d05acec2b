"""The head protocol: scikit-learn's surface, fitted from moments only, scored in log space."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import NDArray
from scipy.special import logsumexp

from ghofl.errors import ConfigError, InputError, NotFittedError, UnsupportedModeError
from ghofl.heads._inputs import check_features, check_training_data, sklearn_flavoured
from ghofl.heads._params import Constraint, resolve_params
from ghofl.moments.core import Moments, compute_moments
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import Mode, StatsMeta
from ghofl.stats.schema import mode_supports, modes_supporting

F64 = NDArray[np.float64]
#: smallest normal float64: the floor of a probability whose log is finite
_TINY = float(np.finfo(np.float64).tiny)


class Head(ABC):
    """Base class of every classification head.

    Subclasses store hyperparameters in ``__init__`` (no work, no validation there), declare
    each of them once in ``parameter_constraints`` (checked at fit time), declare their
    fitted array attributes (names ending in ``_``) in ``fitted_arrays`` and implement
    :meth:`_fit` and :meth:`_decision` (the per-class scores, (n, C)).

    The heads are scikit-learn classifiers: ``get_params``/``set_params``, estimator tags
    (``__sklearn_tags__``, read lazily from scikit-learn when it asks), ``sklearn.base.clone``,
    ``is_classifier``, ``cross_val_score``, ``GridSearchCV`` and ``Pipeline`` work with the
    thin :meth:`fit`. :meth:`decision_function` follows scikit-learn's shapes: (n,) for two
    classes, (n, C) for more, so its binary tools (``roc_auc_score`` on decision values,
    ``CalibratedClassifierCV``, ``RocCurveDisplay.from_estimator``) take the heads as they take
    scikit-learn's own classifiers. :meth:`class_scores` always gives the per-class scores
    (n, C), whatever C.

    Fitted attributes common to all heads
    -------------------------------------
    meta_ : StatsMeta
        Metadata of the statistics the head was fitted on (encoder, projection, classes).
    classes_ : ndarray, shape (C,)
        What :meth:`predict` returns: ``arange(C)`` (int64; indices into ``meta_.classes``)
        when fitted from statistics, or from labels 0..C-1; the sorted distinct labels when
        :meth:`fit` was given other labels (strings, gaps). A saved head keeps the class names
        only, so a loaded head predicts indices.
    n_features_in_ : int
        Dimension of the inputs accepted: the encoder dimension d (projected internally when
        the statistics were projected).
    params_ : dict
        The hyperparameters as resolved by ``parameter_constraints`` (``get_params()`` keeps
        the values as given).
    """

    name: ClassVar[str] = ""
    #: lowest upload mode the head can be fitted from
    min_mode: ClassVar[Mode] = "diag"
    #: names of fitted ndarray attributes saved with the head
    fitted_arrays: ClassVar[tuple[str, ...]] = ()
    #: names of fitted JSON-serialisable (non-array) attributes saved with the head
    fitted_scalars: ClassVar[tuple[str, ...]] = ()
    #: fitted arrays that may hold -inf (log priors of classes without samples); every other
    #: entry of a fitted array must be finite
    neg_inf_arrays: ClassVar[frozenset[str]] = frozenset()
    #: every hyperparameter and its constraint (:mod:`ghofl.heads._params`), the one place
    #: where parameters are checked
    parameter_constraints: ClassVar[dict[str, Constraint]] = {}
    #: fewest samples :meth:`fit` accepts (heads estimating a covariance need 2)
    min_samples: ClassVar[int] = 1
    #: upload mode of the statistics :meth:`fit` computes from pooled data
    fit_mode: ClassVar[Mode | None] = None
    #: scikit-learn < 1.6 reads the estimator type from this attribute
    _estimator_type: ClassVar[str] = "classifier"

    # ------------------------------------------------------------------ parameters
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Hyperparameters as given to ``__init__``.

        ``deep`` is accepted for scikit-learn; heads hold no nested estimators.
        """
        sig = inspect.signature(type(self).__init__)
        return {p: getattr(self, p) for p in sig.parameters if p != "self"}

    def set_params(self, **params: Any) -> Self:
        """Set hyperparameters (checked at the next fit, as in scikit-learn)."""
        valid = self.get_params()
        for key, value in params.items():
            if key not in valid:
                raise ConfigError(
                    f"{type(self).__name__} has no parameter {key!r}; valid parameters: "
                    f"{', '.join(sorted(valid))}"
                )
            setattr(self, key, value)
        return self

    def _validate_params(self) -> dict[str, Any]:
        """The hyperparameters checked against ``parameter_constraints`` and resolved.

        Called at fit time (and by front ends before fitting); nothing is written back into
        the parameters. Raises ConfigError naming the head, the parameter, the allowed values
        and the value given.
        """
        # constrained attributes a subclass stores without taking them in __init__ too
        given = {k: getattr(self, k) for k in self.parameter_constraints if hasattr(self, k)}
        params = resolve_params(type(self).__name__, self.parameter_constraints,
                                {**given, **self.get_params()})
        self._check_params(params)
        return params

    def _check_params(self, params: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Checks across parameters (resolved values); raise ConfigError."""

    # ------------------------------------------------------------------ scikit-learn
    def __sklearn_tags__(self) -> Any:
        """Estimator tags for scikit-learn >= 1.6 (scikit-learn imported here only).

        A classifier that needs y, takes dense 2-D finite float input and is not multi-output.
        """
        from sklearn.utils import ClassifierTags, InputTags, Tags, TargetTags

        return Tags(
            estimator_type="classifier",
            target_tags=TargetTags(required=True, single_output=True),
            transformer_tags=None,
            classifier_tags=ClassifierTags(poor_score=False),
            regressor_tags=None,
            input_tags=InputTags(two_d_array=True, sparse=False, allow_nan=False),
        )

    def _more_tags(self) -> dict[str, Any]:
        """Estimator tags for scikit-learn < 1.6."""
        return {"requires_y": True, "allow_nan": False, "multioutput": False}

    def __sklearn_is_fitted__(self) -> bool:
        """Whether the head is fitted (``sklearn.utils.validation.check_is_fitted``)."""
        return self._is_fitted()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # ------------------------------------------------------------------ fitting
    def fit_from_stats(self, stats: ClientStats) -> Self:
        """Fit from aggregated statistics (the federated path)."""
        self._check_mode(stats.meta)
        return self.fit_from_moments(compute_moments(stats))

    def fit_from_moments(self, moments: Moments) -> Self:
        """Fit from :class:`~ghofl.moments.Moments` derived from the aggregate."""
        self.params_ = self._validate_params()
        self._check_mode(moments.meta)
        self.meta_ = moments.meta
        self.classes_ = np.arange(moments.num_classes, dtype=np.int64)
        proj = moments.meta.projection
        self.n_features_in_ = proj.input_dim if proj is not None else moments.dim
        self._fit(moments)
        return self

    def fit(self, X: NDArray[Any], y: NDArray[Any], classes: Any = None) -> Self:
        """Convenience: fit on pooled data by computing its statistics first.

        The statistics are computed in upload mode ``fit_mode`` (default: ``min_mode``).

        Parameters
        ----------
        X : array_like, shape (n, d)
        y : array_like, shape (n,)
            Class labels of any hashable kind (``classes_`` then holds the sorted distinct
            labels, which :meth:`predict` returns), or class indices when ``classes`` is
            given.
        classes : int or sequence of str, optional
            Number or names of the classes, with ``y`` holding indices 0..C-1.
        """
        data = check_training_data(type(self).__name__, X, y, classes, self.min_samples)
        mode = self.fit_mode or self.min_mode
        self.fit_from_stats(compute_stats(data.X, data.y, data.classes, mode=mode))
        if data.labels is not None:
            self.classes_ = data.labels
        return self

    def _check_mode(self, meta: StatsMeta) -> None:
        """Raise UnsupportedModeError unless the schema of ``meta.mode`` supports ``min_mode``."""
        if not mode_supports(meta.mode, self.min_mode):
            raise UnsupportedModeError(
                f"head {self.name!r} needs upload mode {self.min_mode!r} or richer "
                f"({modes_supporting(self.min_mode)}); the "
                f"statistics are mode {meta.mode!r}. Recompute the client statistics with "
                f"--mode {self.min_mode}, or choose heads that fit mode {meta.mode!r}"
            )

    @abstractmethod
    def _fit(self, moments: Moments) -> None:
        """Set the fitted arrays from moments (dimension = statistics space)."""

    @abstractmethod
    def _decision(self, Z: F64) -> F64:
        """Unnormalised log-scores (n, C) for inputs in the statistics space."""

    # ------------------------------------------------------------------ prediction
    def _is_fitted(self) -> bool:
        return hasattr(self, "meta_")

    def _check_fitted(self) -> None:
        if not self._is_fitted():
            error = sklearn_flavoured(NotFittedError, "sklearn.exceptions", "NotFittedError")
            raise error(
                f"this {type(self).__name__} is not fitted yet; call fit_from_stats, "
                "fit_from_moments or fit first"
            )

    def _prepare(self, X: NDArray[Any]) -> F64:
        """Checked, finite float64 inputs (n, d), projected when the statistics were."""
        Z = self._checked_input(X)
        check_finite_inputs(Z)
        if self.meta_.projection is not None:
            Z = self.meta_.projection.apply(Z)
        return Z

    def _checked_input(self, X: NDArray[Any]) -> F64:
        """``X`` as a float64 (n, n_features_in_) array, every check but finiteness done.

        :meth:`_validated_input` converted to float64: no copy when ``X`` is float64 already;
        finiteness is left to the caller (:func:`check_finite_inputs`, or a check folded into
        its first product).
        """
        Z: F64 = np.asarray(self._validated_input(X), dtype=np.float64)
        return Z

    def _validated_input(self, X: NDArray[Any]) -> NDArray[Any]:
        """``X`` as a numeric (n, n_features_in_) array in its own dtype, checked but finiteness.

        The checks and messages of :meth:`_checked_input`, without its float64 conversion:
        a float32 or integer ``X`` stays float32 or integer (an object array, e.g. a pandas
        frame of numbers, is converted as :func:`~ghofl.heads._inputs.check_features` does).
        For heads whose first product converts ``X`` block by block
        (:func:`~ghofl.heads._linalg.project_rows`) instead of as a whole (n, d) float64 copy.
        """
        self._check_fitted()
        X = np.asarray(X)
        if X.dtype.kind == "O":  # e.g. a pandas frame of numbers; non-numbers are refused
            X = check_features(type(self).__name__, X)
        if X.ndim != 2:
            raise InputError(
                f"inputs must be a 2-D array (n, d); got shape {X.shape}. Reshape your data: "
                "X.reshape(1, -1) for a single sample, X.reshape(-1, 1) for a single feature"
            )
        if X.shape[1] != self.n_features_in_:
            from ghofl.client.transforms import recorded_feature_transform, transformed_dim

            done = recorded_feature_transform(self.meta_.encoder)
            hint = "use the same encoder as the clients"
            try:
                matches = (done != "none"
                           and transformed_dim(X.shape[1], done) == self.n_features_in_)
            except ConfigError:  # e.g. the kernel map's file is not on this machine
                matches = True
            if matches:
                hint = (f"the clients applied the feature transform {done!r} to their "
                        "embeddings; apply it to these too (ghofl.client.transforms."
                        f"apply_feature_transform(X, {done!r}), or --feature-transform "
                        f"{done} on the command line)")
            raise InputError(
                f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input: it was fitted on "
                f"{self.n_features_in_}-dimensional embeddings but got {X.shape[1]} "
                f"features; {hint}"
            )
        if X.dtype.kind not in "fiu":
            raise InputError(f"inputs must be numeric; got dtype {X.dtype}")
        return X

    def _scores(self, X: NDArray[Any]) -> F64:
        """Per-class scores (n, C) of raw inputs: :meth:`_decision` of :meth:`_prepare`.

        Heads may override it to fold the input checks into their first product; the
        checks and their messages stay those of :meth:`_prepare`.
        """
        return self._decision(self._prepare(X))

    def class_scores(self, X: NDArray[Any]) -> F64:
        """Per-class log-scores (joint log-likelihood-like), shape (n, C) for every C.

        Their softmax is :meth:`predict_proba` and their argmax :meth:`predict`; use this, not
        :meth:`decision_function`, wherever the full score matrix is meant.

        Parameters
        ----------
        X : array_like, shape (n, d)

        Returns
        -------
        ndarray, shape (n, C)
            Finite, or -inf for a class the head gives probability 0 (never for every class
            of a row).

        Raises
        ------
        InputError
            A score is NaN or +inf (inputs far outside the range the head was fitted on), so
            no prediction would be meaningful.
        """
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            scores = self._scores(X)
        if np.isfinite(scores).all():  # the common case, in one pass
            return scores
        bad = np.isnan(scores) | (scores == np.inf)
        if np.any(bad) or (scores.size and np.any(np.max(scores, axis=1) == -np.inf)):
            row = int(np.flatnonzero(bad.any(axis=1) | (np.max(scores, axis=1) == -np.inf))[0])
            raise InputError(
                f"{type(self).__name__} produced non-finite scores for input row {row} (its "
                f"largest |value| is {float(np.max(np.abs(np.asarray(X)[row]))):.3g}); the "
                "inputs are far outside the range of the fitted statistics or the head is "
                "corrupt; check the encoder and the scale of the embeddings"
            )
        return scores

    def decision_function(self, X: NDArray[Any]) -> F64:
        """Confidence scores in scikit-learn's shapes: (n,) for two classes, (n, C) for more.

        For two classes, the score of ``classes_[1]`` relative to ``classes_[0]``: the
        difference of their :meth:`class_scores`, which is the log-odds
        ``log(p_1 / p_0)`` of :meth:`predict_proba`. It is > 0 exactly where :meth:`predict`
        returns ``classes_[1]`` (a tie, 0, goes to ``classes_[0]``); +-inf where one class has
        probability 0. For more classes, :meth:`class_scores` (argmax = prediction).

        Parameters
        ----------
        X : array_like, shape (n, d)

        Returns
        -------
        ndarray, shape (n,) when C == 2, else shape (n, C)

        Raises
        ------
        InputError
            As :meth:`class_scores`.
        """
        scores = self.class_scores(X)
        if scores.shape[1] != 2:
            return scores
        with np.errstate(over="ignore"):  # a class of probability 0 gives +-inf, never NaN
            out: F64 = scores[:, 1] - scores[:, 0]
        return out

    def predict_log_proba(self, X: NDArray[Any]) -> F64:
        """Log posterior probabilities (n, C), computed with log-sum-exp."""
        s = self.class_scores(X)
        out: F64 = s - logsumexp(s, axis=1, keepdims=True)
        return out

    def predict_proba(self, X: NDArray[Any]) -> F64:
        """Posterior probabilities (n, C); rows sum to 1.

        A probability is exactly 0 only where :meth:`predict_log_proba` is -inf (a class the
        head rules out, e.g. one without samples). One too small for a normal float64 (log
        below about -708) is reported as the smallest normal float64 instead of underflowing
        to 0, as scikit-learn's discriminant analysis does, so ``log(predict_proba)`` is finite
        wherever ``predict_log_proba`` is.
        """
        log_proba = self.predict_log_proba(X)
        proba: F64 = np.exp(log_proba)
        floor = (proba < _TINY) & (log_proba > -np.inf)
        proba[floor] = _TINY
        return proba

    def predict(self, X: NDArray[Any]) -> NDArray[Any]:
        """Predicted classes (n,): entries of ``classes_``.

        These are int64 indices into ``meta_.classes`` unless :meth:`fit` was given other labels.
        """
        idx = np.argmax(self.class_scores(X), axis=1).astype(np.int64)
        out: NDArray[Any] = idx if self._labels_are_indices() else self.classes_[idx]
        return out

    def _labels_are_indices(self) -> bool:
        c = self.classes_
        return bool(c.dtype == np.int64 and np.array_equal(c, np.arange(c.size)))

    def score(self, X: NDArray[Any], y: NDArray[Any]) -> float:
        """Accuracy on (X, y)."""
        return float(np.mean(self.predict(X) == np.asarray(y)))

    # ------------------------------------------------------------------ persistence
    def get_state(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Fitted arrays and fitted scalars (for :func:`ghofl.heads.save_head`)."""
        self._check_fitted()
        arrays = {k: np.ascontiguousarray(getattr(self, k)) for k in self.fitted_arrays}
        scalars = {k: _jsonable(getattr(self, k)) for k in self.fitted_scalars}
        return arrays, scalars

    def set_state(
        self, meta: StatsMeta, arrays: dict[str, NDArray[Any]], scalars: dict[str, Any]
    ) -> Self:
        """Restore a fitted head (inverse of :meth:`get_state`), after :meth:`check_state`."""
        self.check_state(meta, arrays, scalars)
        self.meta_ = meta
        self.classes_ = np.arange(meta.num_classes, dtype=np.int64)
        self.n_features_in_ = meta.projection.input_dim if meta.projection else meta.dim
        for k in self.fitted_arrays:
            setattr(self, k, arrays[k])
        for k in self.fitted_scalars:
            setattr(self, k, scalars[k])
        self.params_ = self._validate_params()
        return self


    # ------------------------------------------------------------------ validation of a state
    def check_state(
        self, meta: StatsMeta, arrays: dict[str, NDArray[Any]], scalars: dict[str, Any]
    ) -> None:
        """Check a saved state before it is used.

        Every fitted array present, float64, of its exact shape (no broadcasting) and finite (-inf
        allowed only in :attr:`neg_inf_arrays`), no unexpected array, and the scalars scoring uses.

        Raises
        ------
        InputError
            Naming the value, what was expected and what was found.
        """
        owner = type(self).__name__
        if not isinstance(scalars, dict):
            raise InputError(
                f"saved {owner} has fitted scalars of type {type(scalars).__name__}; expected "
                "a JSON object; the file is corrupt"
            )
        missing = [k for k in self.fitted_arrays if k not in arrays]
        missing += [k for k in self.fitted_scalars if k not in scalars]
        if missing:
            raise InputError(
                f"saved {owner} lacks fitted value(s) {missing}; the file is corrupt"
            )
        extra = sorted(k for k in arrays if k not in self.fitted_arrays)
        if extra:
            raise InputError(
                f"saved {owner} holds unexpected array(s) {extra}; it holds exactly "
                f"{list(self.fitted_arrays)}; the file is corrupt or belongs to another head"
            )
        shapes = self._fitted_shapes(meta, scalars)
        for name in self.fitted_arrays:
            arr = arrays[name]
            if not isinstance(arr, np.ndarray) or arr.dtype != np.float64:
                got = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
                raise InputError(
                    f"saved {owner} array {name} has dtype {got}; expected float64; the file "
                    "is corrupt"
                )
            if arr.shape != shapes[name]:
                raise InputError(
                    f"saved {owner} array {name} has shape {arr.shape}; expected "
                    f"{shapes[name]} for C={meta.num_classes} classes and d={meta.dim}; the "
                    "file is corrupt or its metadata belongs to another model"
                )
            bad = np.isnan(arr) | (arr == np.inf)
            if name not in self.neg_inf_arrays:
                bad |= arr == -np.inf
            if np.any(bad):
                raise InputError(
                    f"saved {owner} array {name} holds {int(np.count_nonzero(bad))} NaN or "
                    "infinite value(s); scores computed from it would be meaningless; the file "
                    "is corrupt, refit the head"
                )
        self._check_arrays(arrays)

    def _fitted_shapes(
        self, meta: StatsMeta, scalars: dict[str, Any]
    ) -> dict[str, tuple[int, ...]]:
        """Exact shape of every fitted array for ``meta`` (C classes, dimension d)."""
        raise NotImplementedError(f"{type(self).__name__} does not declare its fitted shapes")

    def _check_arrays(self, arrays: dict[str, NDArray[Any]]) -> None:  # noqa: B027 - hook
        """Head-specific checks of values (e.g. positive variances); raise InputError."""


def check_finite_inputs(Z: NDArray[Any]) -> None:
    """Raise InputError when the inputs ``Z`` (any numeric dtype) hold a NaN or an infinity."""
    if not np.all(np.isfinite(Z)):
        raise InputError("inputs contain NaN or infinite values; clean them before predicting")


def scalar_int(owner: str, scalars: dict[str, Any], name: str, lo: int, hi: int) -> int:
    """``scalars[name]`` if it is an integer in [lo, hi], else InputError."""
    v = scalars.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InputError(
            f"saved {owner} has {name} = {v!r:.60}; expected an integer from {lo} to {hi}; "
            "the file is corrupt"
        )
    return v


def scalar_positive(owner: str, scalars: dict[str, Any], name: str) -> float:
    """``scalars[name]`` if it is a finite number > 0, else InputError."""
    v = scalars.get(name)
    ok = isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) and v > 0
    if not ok:
        raise InputError(
            f"saved {owner} has {name} = {v!r:.60}; expected a finite number > 0; the file "
            "is corrupt"
        )
    return float(v)  # type: ignore[arg-type]


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, tuple):
        return list(v)
    return v
