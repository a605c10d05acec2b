"""The model directory: fitted heads saved together with a manifest.

Layout::

    <model_dir>/manifest.json   {"format": "ghofl.model", "format_version": 1,
                                 "ghofl_version": ..., "heads": {NAME: {"file": "NAME.ghh",
                                 "head": TYPE, "sha256": ..., "params": {...},
                                 "fit_seconds": ...}, ...},
                                 "stats": {StatsMeta fields, plus what the writer adds,
                                 e.g. n_samples, counts, source},
                                 "ood": {"file": "ood.npz", "sha256": ..., "threshold": ...,
                                 "quantile": ..., "score": ..., "rule": ..., ...} (optional),
                                 "default_head": NAME, "default_head_rule": TEXT (optional),
                                 "license": SPDX (optional), "command": the fit command
                                 (optional), "evaluations": [...] (``ghofl evaluate
                                 --update-card``, :mod:`ghofl.model.card_update`),
                                 ...extra keys, "digest": SHA-256 of the rest}
    <model_dir>/<NAME>.ghh      one head per file (:func:`ghofl.heads.registry.save_head`)
    <model_dir>/ood.npz         class means and covariance factor of the out-of-distribution
                                score (:mod:`ghofl.heads.ood`), when the writer gave one
    <model_dir>/MODEL_CARD.md   the model card (:mod:`ghofl.model.card`): documentation
                                only, not in the manifest or its digest, never read back

A directory is written atomically (:func:`ghofl.files.atomic_directory`): it is complete or
absent, and an existing model directory is replaced only once every head is saved.

Binding heads to names
----------------------
Each head file records which head it is (its ``head`` header: the registered type, e.g.
``qda``). Each manifest entry records the type it expects (``head``) and the SHA-256 of the
head file (``sha256``), and the manifest carries a ``digest``: the SHA-256 of its canonical
JSON (sorted keys, no spaces) without the digest. Loading refuses a manifest that does not
match its digest (edited or corrupt), a head file whose bytes differ from the entry's
``sha256``, a head file whose own record differs from the entry's ``head``, and an entry named
after a registered head (``lda``) whose file holds another head (``qda.ghh``) — the last two
even when the manifest was edited and its digests recomputed.

A head whose file is absent is an error for that head only: ``load_model(...,
missing_ok=True)`` loads the other heads (the digest and every present file still checked),
and :meth:`FittedModel.head` names the missing file when the absent head is asked for.

A manifest without its ``digest``, or with a head or ``ood`` entry without its ``sha256``
(written before these fields existed, or stripped of them), is refused before any file is
read: removing the checks would otherwise turn them off. ``load_model(...,
allow_unsigned=True)`` (``--allow-unsigned-model`` on the CLI) reads such a legacy model with
the checks its fields allow, with an :class:`UnsignedModelWarning` naming what is unchecked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ghofl.client.transforms import (
    apply_feature_transform,
    base_dim,
    check_feature_transform,
    recorded_feature_transform,
)
from ghofl.errors import ConfigError, GhoflError, InputError, StatsFormatError
from ghofl.evaluation.metrics import HeadScore, evaluate_heads
from ghofl.files import atomic_directory
from ghofl.heads.base import Head
from ghofl.heads.build import to_jsonable
from ghofl.heads.ood import OOD_RULE, OOD_SCORE, MahalanobisOOD
from ghofl.heads.registry import available_heads, load_head, save_head
from ghofl.model.card import CARD_FILE, model_card
from ghofl.model.manifest import (
    MANIFEST,
    MODEL_FIX,
    UNSIGNED_FIX,
    UnsignedModelWarning,
    check_digest,
    check_signed,
    file_sha256,
    manifest_digest,
    read_manifest,
)
from ghofl.stats.meta import StatsMeta

__all__ = [
    "MANIFEST",
    "MODEL_FORMAT",
    "MODEL_FORMAT_VERSION",
    "OOD_FILE",
    "FittedModel",
    "UnsignedModelWarning",
    "check_model_target",
    "check_signed",
    "load_model",
    "load_ood",
    "save_model",
    "update_ood",
]

MODEL_FORMAT = "ghofl.model"
MODEL_FORMAT_VERSION = 1
OOD_FILE = "ood.npz"
_RESERVED = frozenset({"format", "format_version", "ghofl_version", "heads", "digest", "ood",
                       "command", "evaluations", "test_scores"})


def check_model_target(path: Path, option: str = "out_dir") -> None:
    """Refuse to replace anything but a ghofl model directory or an empty directory.

    Parameters
    ----------
    path : Path
        Where a model directory is to be written.
    option : str, default "out_dir"
        What named the path (the CLI passes ``"--out"``), for messages.

    Raises
    ------
    InputError
        ``path`` is a file, or a non-empty directory without a ``manifest.json``.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} '{path}' exists and is not a directory; choose another path")
    if path.is_dir() and any(path.iterdir()) and not (path / MANIFEST).is_file():
        raise InputError(
            f"refusing to replace {option} '{path}': it is a non-empty directory that is not a "
            f"ghofl model directory (no {MANIFEST}); choose another path"
        )


def save_model(
    out_dir: Path,
    heads: Mapping[str, Head],
    *,
    stats_meta: StatsMeta,
    extra: Mapping[str, Any] | None = None,
    fit_seconds: Mapping[str, float] | None = None,
    option: str = "out_dir",
    ood: MahalanobisOOD | None = None,
    scores: Mapping[str, Mapping[str, Any]] | None = None,
    command: str | None = None,
) -> Path:
    """Write fitted heads, their manifest and ``MODEL_CARD.md`` to ``out_dir``, atomically.

    Parameters
    ----------
    out_dir : Path
        The model directory; an existing model directory (or empty directory) is replaced.
    heads : mapping of str to Head
        Fitted heads by name; head ``NAME`` goes to ``NAME.ghh``.
    stats_meta : StatsMeta
        Metadata of the statistics the heads were fitted from (the manifest's ``stats``).
    extra : mapping, optional
        JSON-ready entries added to the manifest; an entry ``"stats"`` (a mapping) is merged
        into the ``stats`` section (e.g. ``n_samples``, ``counts``, ``source``).
    fit_seconds : mapping of str to float, optional
        Fitting time per head, recorded in the manifest.
    option : str, default "out_dir"
        What named ``out_dir``, for messages.
    ood : MahalanobisOOD, optional
        Fitted out-of-distribution score (statistics space of ``stats_meta``), written to
        ``ood.npz`` and described under the manifest's ``ood`` (with the file's SHA-256).
    scores : mapping of head name to ``{"accuracy", "n"}``, optional
        Test scores, reported in the model card and recorded as the manifest's
        ``test_scores``.
    command : str, optional
        The command line that reproduces the model, for the model card.

    Returns
    -------
    Path
        ``out_dir``.

    Raises
    ------
    InputError
        ``out_dir`` may not be replaced (see :func:`check_model_target`).
    ConfigError
        No heads, a head name unusable as a file name, a head fitted on other classes or
        dimension than ``stats_meta``, or an ``extra`` key the format reserves.
    NotFittedError
        A head is not fitted (nothing is written).
    """
    out_dir = Path(out_dir)
    entries = _check_heads(heads, stats_meta)
    extras = dict(extra or {})
    reserved = sorted(k for k in extras if k in _RESERVED)
    if reserved:
        raise ConfigError(
            f"save_model extra key {reserved[0]!r} is reserved by the model format; use "
            f"another key (reserved: {', '.join(sorted(_RESERVED))})"
        )
    stats_extra = extras.pop("stats", None) or {}
    if not isinstance(stats_extra, Mapping):
        raise ConfigError(
            f"save_model extra['stats'] must be a mapping merged into the manifest's stats; "
            f"got {type(stats_extra).__name__}"
        )
    default = extras.get("default_head")
    if default is not None and default not in heads:
        raise ConfigError(f"save_model extra['default_head'] {default!r} is not one of the "
                          f"heads saved ({', '.join(heads)}); name a saved head")
    check_model_target(out_dir, option)
    from ghofl import __version__

    manifest: dict[str, Any] = {
        "format": MODEL_FORMAT,
        "format_version": MODEL_FORMAT_VERSION,
        "ghofl_version": __version__,
        "heads": entries,
        "stats": {**stats_meta.to_dict(), **dict(stats_extra)},
        **extras,
        **({"command": command} if command else {}),
        **({"test_scores": {k: dict(v) for k, v in scores.items()}} if scores else {}),
    }
    for name, seconds in (fit_seconds or {}).items():
        if name in entries:
            entries[name]["fit_seconds"] = float(seconds)
    for name, head in heads.items():
        check_fitted_head(name, head)
    with atomic_directory(out_dir) as tmp:
        for name, head in heads.items():
            save_head(head, tmp / entries[name]["file"])
            entries[name]["sha256"] = file_sha256(tmp / entries[name]["file"])
        if ood is not None:
            manifest["ood"] = _write_ood(tmp / OOD_FILE, ood, stats_meta)
        manifest["digest"] = manifest_digest(manifest)
        text = json.dumps(manifest, indent=2) + "\n"
        (tmp / MANIFEST).write_text(text, encoding="utf-8")
        chosen = {name: head.get_state()[1] for name, head in heads.items()}
        card = model_card(manifest, chosen=chosen, scores=scores, command=command)
        (tmp / CARD_FILE).write_text(card, encoding="utf-8")
    return out_dir


def rewrite_manifest(model_dir: Path, manifest: Mapping[str, Any], card: str) -> None:
    """Replace a model directory's manifest and card at once, re-signing the manifest.

    The head and ``ood`` files are hard-linked (copied where links fail) into a temporary
    directory beside ``model_dir``, the new ``manifest.json`` and ``MODEL_CARD.md`` written
    there, and the temporary swapped for ``model_dir`` (:func:`ghofl.files.atomic_directory`):
    a reader sees the old model or the new one, never a mix. A manifest with a ``digest`` gets
    the digest of its new content; an unsigned (legacy) one stays unsigned, so that it is
    still read only with ``allow_unsigned``.

    Parameters
    ----------
    model_dir : Path
        A model directory that :func:`load_model` read (the caller checked it).
    manifest : mapping
        Its new manifest (without a valid digest: it is recomputed here).
    card : str
        Its new model card.
    """
    import shutil

    model_dir = Path(model_dir)
    body = dict(manifest)
    if body.get("digest") is not None:
        body["digest"] = manifest_digest(body)
    with atomic_directory(model_dir) as tmp:
        for src in model_dir.iterdir():
            if src.name in (MANIFEST, CARD_FILE) or not src.is_file():
                continue
            try:
                os.link(src, tmp / src.name)
            except OSError:
                shutil.copy2(src, tmp / src.name)
        (tmp / MANIFEST).write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
        (tmp / CARD_FILE).write_text(card, encoding="utf-8")


def _write_ood(path: Path, ood: MahalanobisOOD, meta: StatsMeta) -> dict[str, Any]:
    arrays, scalars = ood.get_state()
    if arrays["means_"].shape != (meta.num_classes, meta.dim):
        raise ConfigError(
            f"the OOD score was fitted on means of shape {arrays['means_'].shape}, but "
            f"stats_meta describes {meta.num_classes} classes in dimension {meta.dim}; fit it "
            "on the statistics the heads were fitted from"
        )
    with open(path, "wb") as f:
        np.savez(f, means_=arrays["means_"], chol_=arrays["chol_"])
    return {"file": OOD_FILE, "sha256": file_sha256(path), "score": OOD_SCORE,
            "rule": OOD_RULE, **scalars}


def load_ood(model_dir: Path, manifest: Mapping[str, Any], *,
             allow_unsigned: bool = False) -> MahalanobisOOD | None:
    """The out-of-distribution score of a model directory read by :func:`load_model`.

    ``None`` when its manifest has no ``ood`` entry: a model written before it existed.
    ``allow_unsigned``: as for :func:`load_model` (an entry without ``sha256`` is read
    unchecked; :func:`load_model` warned about it).

    Raises
    ------
    InputError
        The ``ood.npz`` file is missing, differs from the SHA-256 the manifest records (or
        the entry records none, without ``allow_unsigned``), or is malformed.
    """
    entry = manifest.get("ood")
    if entry is None:
        return None
    path = Path(model_dir) / OOD_FILE
    if not isinstance(entry, dict) or entry.get("file") != OOD_FILE:
        raise InputError(f"'{Path(model_dir) / MANIFEST}' has a malformed ood entry; {MODEL_FIX}")
    if not path.is_file():
        raise InputError(f"'{path}' is missing; copy the whole model directory, or {MODEL_FIX}")
    if entry.get("sha256") is None and not allow_unsigned:
        raise InputError(f"'{Path(model_dir) / MANIFEST}' lacks the SHA-256 of {OOD_FILE}, so "
                         f"its bytes cannot be checked; {UNSIGNED_FIX}")
    if entry.get("sha256") is not None and entry.get("sha256") != file_sha256(path):
        raise InputError(
            f"'{path}' is not the one the manifest was written with (its SHA-256 differs); "
            f"copy the whole model directory again, or {MODEL_FIX}"
        )
    meta = StatsMeta.from_dict(manifest["stats"])
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in MahalanobisOOD.fitted_arrays if k in z.files}
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"'{path}' is not a readable .npz archive ({exc}); {MODEL_FIX}") from exc
    return MahalanobisOOD.from_state(arrays, entry, meta.num_classes, meta.dim, f"'{path}'")


def update_ood(model_dir: Path, ood: MahalanobisOOD, *,
               allow_unsigned: bool = False) -> dict[str, Any]:
    """Record the threshold of ``ood`` (e.g. :meth:`MahalanobisOOD.calibrate`) in the manifest.

    Only the manifest's ``ood`` entry (threshold, calibration, rule, fpr) and its ``digest``
    change, with the model card that states them, written together atomically
    (:func:`rewrite_manifest`); ``ood.npz`` is unchanged, and ``ood`` must hold its arrays.
    Returns the new ``ood`` entry.

    Raises
    ------
    InputError
        The model directory is refused by :func:`load_model`, has no OOD score, or ``ood`` was
        not read from it (its class means or covariance factor differ from ``ood.npz``).
    """
    import warnings

    model_dir = Path(model_dir)
    with warnings.catch_warnings():  # the caller loaded the model already and was warned
        warnings.simplefilter("ignore", UnsignedModelWarning)
        model = load_model(model_dir, allow_unsigned=allow_unsigned, missing_ok=True)
    manifest = dict(model.manifest)
    stored = load_ood(model_dir, manifest, allow_unsigned=allow_unsigned)
    if stored is None:
        raise InputError(f"the model in '{model_dir}' has no OOD score ({OOD_FILE}); fit it "
                         "again with `ghofl fit` to get one")
    arrays, scalars = ood.get_state()
    if any(not np.array_equal(arrays[k], getattr(stored, k)) for k in stored.fitted_arrays):
        raise InputError(f"the OOD score given differs from '{model_dir / OOD_FILE}'; calibrate "
                         "the one load_ood reads from this model directory")
    old = {k: v for k, v in manifest["ood"].items() if k not in ("fpr", "n_calibration")}
    manifest["ood"] = entry = {**old, **scalars}
    chosen = {name: head.get_state()[1] for name, head in model.heads.items()}
    # manifest and card together (the card states the threshold), re-signed if signed
    rewrite_manifest(model_dir, manifest, model_card(manifest, chosen=chosen))
    return entry


def _check_heads(heads: Mapping[str, Head], meta: StatsMeta) -> dict[str, dict[str, Any]]:
    if not heads:
        raise ConfigError("save_model needs at least one fitted head; got none")
    entries: dict[str, dict[str, Any]] = {}
    for name, head in heads.items():
        file = f"{name}.ghh"
        if not name or name.startswith(".") or Path(file).name != file or "\\" in name:
            raise ConfigError(
                f"head name {name!r} cannot name a file in a model directory; use letters, "
                "digits, '-' or '_'"
            )
        fitted = getattr(head, "meta_", None)
        if isinstance(fitted, StatsMeta) and (
            fitted.classes != meta.classes or fitted.dim != meta.dim
        ):
            raise ConfigError(
                f"head {name!r} was fitted on {fitted.num_classes} classes in dimension "
                f"{fitted.dim}, but stats_meta describes {meta.num_classes} classes in "
                f"dimension {meta.dim}; pass the metadata of the statistics the heads were "
                "fitted from"
            )
        kind = head.name or type(head).__name__
        if name in available_heads() and name != kind:
            raise ConfigError(
                f"head name {name!r} is a registered head, but the head given under it is a "
                f"{kind!r} head; save it under {kind!r} or a name that is not registered"
            )
        entries[name] = {"file": file, "head": kind,
                         "params": to_jsonable(head.get_params())}
    return entries


F64 = NDArray[np.float64]


class FittedModel(NamedTuple):
    """A model directory as :func:`load_model` reads it, scoring raw embeddings itself.

    It unpacks as ``heads, manifest = load_model(path)``. Its methods take RAW embeddings (the
    encoder's output, before the clients' feature transform) and apply the transform the model
    records (:attr:`transform`) themselves, in float64 as the clients computed it.

    Attributes
    ----------
    heads : dict of str to Head
        The fitted heads, in manifest order.
    manifest : dict
        The parsed ``manifest.json``.
    """

    heads: dict[str, Head]
    manifest: dict[str, Any]

    @property
    def transform(self) -> str:
        """The feature transform the clients applied, as recorded in the model's encoder.

        ``"none"`` when it records none (also for a model fitted without encoder information,
        which cannot record one).
        """
        return recorded_feature_transform(self.head().meta_.encoder)

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names; predictions index into them."""
        return tuple(self.head().meta_.classes)

    @property
    def missing(self) -> list[str]:
        """Heads the manifest lists whose file was absent (``load_model(missing_ok=True)``)."""
        return [str(n) for n in self.manifest["heads"] if n not in self.heads]

    @property
    def default_head(self) -> str:
        """The head used when none is named: the manifest's ``default_head`` when recorded.

        A model written before ``default_head`` existed uses the first head of its manifest.
        """
        recorded = self.manifest.get("default_head")
        if isinstance(recorded, str) and recorded in self.manifest["heads"]:
            return recorded
        return str(next(iter(self.manifest["heads"])))

    def head(self, name: str | None = None) -> Head:
        """Head ``name`` (default: :attr:`default_head` when loaded, else the first loaded).

        Raises
        ------
        ConfigError
            The model holds no head ``name``.
        InputError
            Head ``name`` is listed in the manifest, but its file was absent.
        """
        if name is None:
            return self.heads.get(self.default_head) or next(iter(self.heads.values()))
        if name in self.missing:
            entry = self.manifest["heads"][name]
            raise InputError(
                f"head {name!r} is listed in the manifest, but its file {entry['file']!r} is "
                f"missing from the model directory; copy the whole model directory again, or "
                f"use one of the heads present ({', '.join(self.heads)})"
            )
        if name not in self.heads:
            raise ConfigError(f"the model holds no head {name!r}; it holds "
                              f"{', '.join(map(str, self.manifest['heads']))}")
        return self.heads[name]

    def features(self, x: NDArray[Any], transform: str | None = None) -> F64:
        """Raw embeddings x (n, d) → the heads' inputs (n, n_features_in_), in float64.

        Parameters
        ----------
        x : array_like, shape (n, d)
        transform : str, optional
            Apply this transform instead of the recorded one (``"none"``: ``x`` is already
            in the heads' input space).

        Raises
        ------
        InputError
            ``x`` is not of the shape (n, d) that the transform maps to the heads' inputs.
        """
        name = self.transform if transform is None else check_feature_transform(transform)
        z = np.asarray(x, dtype=np.float64)
        if name == "none":
            return z
        want = self.head().n_features_in_
        d = base_dim(want, name)
        if z.ndim != 2 or z.shape[1] != d:
            raise InputError(
                f"x has shape {z.shape}, but the model takes raw embeddings of shape (n, {d}): "
                f"it applies the feature transform {name!r} itself, which maps them to its "
                f"d={want}; embed the data with the clients' encoder"
            )
        out: F64 = apply_feature_transform(z, name)
        return out

    def decision_function(self, x: NDArray[Any], head: str | None = None) -> F64:
        """Confidence scores of head ``head`` (default: the first) for raw embeddings ``x``.

        Shapes as :meth:`Head.decision_function <ghofl.heads.base.Head.decision_function>`.
        """
        return self.head(head).decision_function(self.features(x))

    def predict_proba(self, x: NDArray[Any], head: str | None = None) -> F64:
        """Posterior probabilities (n, C) of head ``head`` for raw embeddings ``x`` (n, d)."""
        return self.head(head).predict_proba(self.features(x))

    def predict(self, x: NDArray[Any], head: str | None = None) -> NDArray[Any]:
        """Predicted classes (n,) of head ``head`` for raw embeddings ``x`` (n, d)."""
        return self.head(head).predict(self.features(x))

    def score(self, x: NDArray[Any], y: NDArray[Any], head: str | None = None) -> float:
        """Accuracy of head ``head`` on raw embeddings ``x`` (n, d) with labels ``y`` (n,)."""
        return self.head(head).score(self.features(x), y)

    def evaluate(self, x: NDArray[Any], y: NDArray[Any], *, what: str = "test",
                 transform: str | None = None) -> dict[str, HeadScore]:
        """Score every head on raw embeddings ``x`` (n, d) with labels ``y`` (n,).

        :func:`~ghofl.evaluation.evaluate_heads` after :meth:`features` (``transform``: as
        there); ``what`` names the data in messages.
        """
        return evaluate_heads(self.heads, self.features(x, transform), y, what=what)


def load_model(model_dir: Path, *, allow_unsigned: bool = False,
               missing_ok: bool = False) -> FittedModel:
    """Read a model directory written by :func:`save_model`.

    Parameters
    ----------
    model_dir : Path
        The directory.
    allow_unsigned : bool, default False
        Read a legacy model whose manifest lacks its ``digest`` or a file's ``sha256``, with
        the checks its fields allow and an :class:`UnsignedModelWarning` naming what is
        unchecked (``--allow-unsigned-model``). Without it such a model is refused.
    missing_ok : bool, default False
        Load the heads whose file is present and leave out those whose file is absent
        (:attr:`FittedModel.missing`; :meth:`FittedModel.head` names the file when one is
        asked for). At least one head must be present. Without it an absent file is an error.

    Returns
    -------
    FittedModel
        ``(heads, manifest)``: the fitted heads, in manifest order, and the parsed
        ``manifest.json``; its methods score raw embeddings.

    Raises
    ------
    InputError
        Not a directory, no or invalid manifest, a newer format version, a head entry
        without a valid file name, or (without ``allow_unsigned``) a manifest without its
        digest or a file's SHA-256.
    StatsFormatError
        A head file is missing (without ``missing_ok``, or every head's) or corrupt.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise InputError(
            f"model directory '{model_dir}' does not exist or is not a directory; {MODEL_FIX}"
        )
    path = model_dir / MANIFEST
    manifest = read_manifest(model_dir, path)
    if not isinstance(manifest, dict) or manifest.get("format") != MODEL_FORMAT \
            or not isinstance(manifest.get("heads"), dict) or not manifest["heads"]:
        raise InputError(f"'{path}' is not a ghofl model manifest; {MODEL_FIX}")
    version = manifest.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise InputError(
            f"'{path}' has format_version {version!r}; expected an integer; {MODEL_FIX}"
        )
    if version > MODEL_FORMAT_VERSION:
        raise InputError(
            f"'{path}' has format version {version}, newer than this ghofl supports "
            f"({MODEL_FORMAT_VERSION}); upgrade ghofl"
        )
    stats = manifest.get("stats")
    if not isinstance(stats, dict):
        raise InputError(f"'{path}' has no stats section describing the statistics; {MODEL_FIX}")
    try:
        expected = StatsMeta.from_dict(stats)
    except GhoflError as exc:
        raise InputError(f"'{path}' has a malformed stats section ({exc}); {MODEL_FIX}") from exc
    files: dict[str, str] = {}
    for name, entry in manifest["heads"].items():
        file = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(file, str) or not file or Path(file).name != file:
            raise InputError(f"'{path}' lists head {name!r} without a valid file name; {MODEL_FIX}")
        files[name] = file
    check_signed(manifest, path, allow_unsigned)  # before any file is read
    heads: dict[str, Head] = {}
    for name, entry in manifest["heads"].items():
        file = files[name]
        if missing_ok and not (model_dir / file).exists():
            continue
        head = load_head(model_dir / file)
        diffs = [d for d in head.meta_.differences(expected) if not d.startswith("mode ")]
        if diffs:
            raise InputError(
                f"head file '{model_dir / file}' does not belong to this model: it was fitted "
                f"on statistics that differ from the manifest's in {'; '.join(diffs)}; copy "
                f"the whole model directory, or {MODEL_FIX}"
            )
        _check_binding(str(name), entry, head, model_dir / file, path)
        heads[name] = head
    if not heads:
        raise StatsFormatError(f"'{model_dir}' holds none of the head files its manifest lists "
                               f"({', '.join(files.values())}); copy the whole model directory "
                               "again")
    check_digest(manifest, path)  # last: a specific fault gets its specific message
    return FittedModel(heads, manifest)


def _check_binding(name: str, entry: dict[str, Any], head: Head, file: Path,
                   path: Path) -> None:
    """Refuse a head file that is not the head the manifest entry ``name`` names."""
    kind = head.name or type(head).__name__
    recorded = entry.get("head")
    if recorded is not None and recorded != kind:
        raise InputError(
            f"'{path}' lists head {name!r} as a {str(recorded)[:40]!r} head, but '{file}' "
            f"records that it holds a {kind!r} head; the manifest was edited, {MODEL_FIX}"
        )
    if name in available_heads() and name != kind:
        raise InputError(
            f"'{path}' points head {name!r} at '{file.name}', which holds a {kind!r} head; "
            f"the manifest was edited, {MODEL_FIX}"
        )
    sha = entry.get("sha256")
    if sha is not None and sha != file_sha256(file):  # None: allowed unsigned (check_signed)
        raise InputError(
            f"head file '{file}' is not the one '{path}' was written with (its SHA-256 "
            f"differs); copy the whole model directory again, or {MODEL_FIX}"
        )


def check_fitted_head(name: str, head: Head) -> None:
    """Refuse to save a head whose state or scores are not finite.

    The fitted arrays go through the checks of loading (:meth:`Head.check_state`), then the
    head scores a probe: the zero input, 8 seeded standard-normal inputs and (when the head
    keeps them, without projection) its class means. A NaN or +inf score, or a row without a
    finite score, raises :class:`ConfigError`.
    """
    arrays, scalars = head.get_state()
    try:
        head.check_state(head.meta_, arrays, scalars)
        d = int(head.n_features_in_)
        rng = np.random.default_rng(0)
        probe = np.vstack([np.zeros((1, d)), rng.standard_normal((8, d))])
        means = getattr(head, "means_", None)
        if means is not None and head.meta_.projection is None and np.shape(means)[1:] == (d,):
            probe = np.vstack([probe, np.asarray(means, dtype=np.float64)])
        head.class_scores(probe)
    except InputError as exc:
        raise ConfigError(
            f"refusing to save head {name!r}: {exc}. Its statistics are numerically degenerate "
            "(e.g. features scaled far below or above 1); rescale the embeddings, or use more "
            "shrinkage"
        ) from exc
