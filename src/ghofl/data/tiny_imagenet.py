r"""Tiny-ImageNet-200 read in place from its official zip archive or from the extracted folder.

The official layout (Stanford CS231n, ``tiny-imagenet-200.zip``)::

    tiny-imagenet-200/wnids.txt                       200 WordNet ids, one per line
    tiny-imagenet-200/words.txt                       "<wnid>\t<names>" (may list more wnids)
    tiny-imagenet-200/train/<wnid>/images/<wnid>_<i>.JPEG
    tiny-imagenet-200/train/<wnid>/<wnid>_boxes.txt   (ignored)
    tiny-imagenet-200/val/images/val_<i>.JPEG
    tiny-imagenet-200/val/val_annotations.txt         "<file>\t<wnid>\t<x0>\t<y0>\t<x1>\t<y1>"
    tiny-imagenet-200/test/images/test_<i>.JPEG       (unlabelled: ignored)

Splits: ``train`` (the ``train/`` folders) and ``test``, which is the labelled validation set
(``val/``, also accepted as ``val`` or ``validation``): the official test images carry no labels.
The class index of a wnid is its position in the **sorted** list of ``wnids.txt``; the
human-readable names come from ``words.txt`` (the wnid itself where that file is missing or
does not list it). Images are 64×64 RGB JPEGs (a few are greyscale and decode to RGB).

A zip is read with random access (never extracted) and may hold the layout at its top level or
under one folder; a directory may be the ``tiny-imagenet-200`` folder or the folder above it.
Any subset of the official training images is accepted (e.g. the first 100 per class).
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ghofl.data.images import ImageFolderSource, check_resize
from ghofl.errors import ConfigError, DataError

__all__ = [
    "TINY_IMAGENET_LAYOUT",
    "TinyImageNetSource",
    "find_tiny_imagenet_root",
    "is_tiny_imagenet",
]

TINY_IMAGENET_LAYOUT = (
    "tiny-imagenet-200/{wnids.txt, words.txt, train/<wnid>/images/*.JPEG, val/images/*.JPEG, "
    "val/val_annotations.txt} (the official tiny-imagenet-200.zip, as a zip or extracted)"
)
_FIX = "re-extract or re-download the official archive, which has the layout " + (
    TINY_IMAGENET_LAYOUT
)
_SPLITS = {"train": "train", "test": "val", "val": "val", "validation": "val"}
_JPEG = (".jpeg", ".jpg")
_WNID = re.compile(r"^n\d{8}$")


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key putting ``val_2`` before ``val_10``."""
    return tuple(
        (0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p
    )


@dataclass(frozen=True)
class _Tree:
    """The files of a candidate layout: names relative to the layout root, and a reader."""

    files: tuple[str, ...]
    read: Callable[[str], bytes]
    where: str
    prefix: str  # how a relative name maps to a member (zip) or a path (directory)


def _zip_tree(zf: zipfile.ZipFile, path: Path) -> _Tree:
    names = [n for n in zf.namelist() if not n.endswith("/") and not n.startswith("__MACOSX/")]
    where = f"archive '{path}'"
    roots = sorted(
        (n[: -len("wnids.txt")] for n in names if n == "wnids.txt" or n.endswith("/wnids.txt")),
        key=lambda p: (p.count("/"), p),
    )
    if not roots:
        raise DataError(f"{where} holds no wnids.txt, so it is not Tiny-ImageNet; {_FIX}")
    prefix = roots[0]
    if prefix.count("/") > 1:
        raise DataError(
            f"{where} holds wnids.txt only at '{prefix}wnids.txt', deeper than one folder; "
            f"{_FIX}"
        )
    files = tuple(n[len(prefix) :] for n in names if n.startswith(prefix))

    def read(rel: str) -> bytes:
        return zf.read(prefix + rel)

    return _Tree(files, read, where, prefix)


def _dir_root(path: Path) -> Path:
    if (path / "wnids.txt").is_file():
        return path
    subs = sorted(p for p in path.iterdir() if p.is_dir() and (p / "wnids.txt").is_file())
    if not subs:
        raise DataError(
            f"directory '{path}' holds no wnids.txt (nor does any folder directly inside it), "
            f"so it is not Tiny-ImageNet; {_FIX}"
        )
    if len(subs) > 1:
        raise DataError(
            f"directory '{path}' holds several Tiny-ImageNet folders "
            f"({', '.join(p.name for p in subs)}); point to one of them"
        )
    return subs[0]


def _dir_tree(path: Path) -> _Tree:
    root = _dir_root(path)
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        files.extend(base + f for f in sorted(filenames))

    def read(rel: str) -> bytes:
        return (root / rel).read_bytes()

    prefix = os.path.relpath(root, path).replace(os.sep, "/")
    return _Tree(tuple(files), read, f"directory '{root}'", "" if prefix == "." else prefix + "/")


def find_tiny_imagenet_root(path: str | os.PathLike[str]) -> str | None:
    """Where ``wnids.txt`` lies in a Tiny-ImageNet zip or directory, or ``None`` if nowhere.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.zip`` archive or a directory.

    Returns
    -------
    str or None
        The prefix of the layout root (``"tiny-imagenet-200/"`` for the official archive,
        ``""`` when ``wnids.txt`` is at the top), or ``None`` when ``path`` is neither a
        directory nor a zip holding ``wnids.txt`` at most one folder deep.
    """
    p = Path(path).expanduser()
    try:
        if p.is_dir():
            return _dir_tree(p).prefix
        if p.is_file() and zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as zf:
                return _zip_tree(zf, p).prefix
    except (DataError, OSError, zipfile.BadZipFile):
        return None
    return None


def is_tiny_imagenet(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (zip or directory) holds a Tiny-ImageNet layout (a ``wnids.txt``)."""
    return find_tiny_imagenet_root(path) is not None


def _text(tree: _Tree, rel: str, required: bool = True) -> str | None:
    if rel not in tree.files:
        if not required:
            return None
        raise DataError(f"{tree.where} has no {rel} in its Tiny-ImageNet folder; {_FIX}")
    try:
        return tree.read(rel).decode("utf-8")
    except (UnicodeDecodeError, OSError, zipfile.BadZipFile, KeyError) as exc:
        raise DataError(
            f"{rel} in {tree.where} could not be read as UTF-8 text ({exc}); {_FIX}"
        ) from exc


def _read_wnids(tree: _Tree) -> tuple[str, ...]:
    text = _text(tree, "wnids.txt")
    assert text is not None
    wnids = [line.strip() for line in text.splitlines() if line.strip()]
    if not wnids:
        raise DataError(
            f"wnids.txt in {tree.where} is empty; it must list one wnid per line; {_FIX}"
        )
    bad = [w for w in wnids if not _WNID.match(w)]
    if bad:
        raise DataError(
            f"wnids.txt in {tree.where} holds {bad[0]!r}, which is not a WordNet id "
            f"(n followed by 8 digits); {_FIX}"
        )
    dup = sorted({w for w in wnids if wnids.count(w) > 1})
    if dup:
        raise DataError(f"wnids.txt in {tree.where} lists {dup[0]!r} twice; {_FIX}")
    return tuple(sorted(wnids))


def _read_words(tree: _Tree, wnids: tuple[str, ...]) -> tuple[str, ...]:
    text = _text(tree, "words.txt", required=False)
    words: dict[str, str] = {}
    for line in (text or "").splitlines():
        wnid, sep, names = line.partition("\t")
        if sep and wnid.strip() in wnids:
            words[wnid.strip()] = names.strip()
    return tuple(words.get(w) or w for w in wnids)


def _train_listing(tree: _Tree, wnids: tuple[str, ...]) -> tuple[list[str], list[int]]:
    index = {w: i for i, w in enumerate(wnids)}
    per_class: dict[str, list[str]] = {w: [] for w in wnids}
    for rel in tree.files:
        parts = rel.split("/")
        if len(parts) != 4 or parts[0] != "train" or parts[2] != "images":
            continue
        if not parts[3].lower().endswith(_JPEG):
            continue
        if parts[1] not in index:
            raise DataError(
                f"{tree.where} holds training images of class folder train/{parts[1]}/, which "
                f"wnids.txt does not list; add the wnid to wnids.txt or remove the folder; {_FIX}"
            )
        per_class[parts[1]].append(rel)
    missing = [w for w in wnids if not per_class[w]]
    if missing:
        raise DataError(
            f"{tree.where} has no training images for {len(missing)} of the {len(wnids)} wnids "
            f"of wnids.txt (first: train/{missing[0]}/images/*.JPEG); every class needs at "
            f"least one; {_FIX}"
        )
    members: list[str] = []
    labels: list[int] = []
    for w in wnids:
        files = sorted(per_class[w], key=_natural)
        members.extend(files)
        labels.extend([index[w]] * len(files))
    return members, labels


def _val_listing(tree: _Tree, wnids: tuple[str, ...]) -> tuple[list[str], list[int]]:
    index = {w: i for i, w in enumerate(wnids)}
    text = _text(tree, "val/val_annotations.txt")
    assert text is not None
    images = {
        rel.rpartition("/")[2]
        for rel in tree.files
        if rel.startswith("val/images/") and rel.count("/") == 2 and rel.lower().endswith(_JPEG)
    }
    labelled: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
            raise DataError(
                f"line {lineno} of val/val_annotations.txt in {tree.where} is malformed "
                f"({line[:80]!r}); each line must be '<file>\\t<wnid>\\t<box>'; {_FIX}"
            )
        name, wnid = fields[0].strip(), fields[1].strip()
        if wnid not in index:
            raise DataError(
                f"line {lineno} of val/val_annotations.txt in {tree.where} labels {name} with "
                f"wnid {wnid!r}, which wnids.txt does not list; use the wnids.txt and "
                f"annotations of the same archive; {_FIX}"
            )
        if name not in images:
            raise DataError(
                f"line {lineno} of val/val_annotations.txt in {tree.where} names val/images/"
                f"{name}, which does not exist; {_FIX}"
            )
        if name in labelled:
            raise DataError(
                f"val/val_annotations.txt in {tree.where} labels {name} twice (line {lineno}); "
                f"{_FIX}"
            )
        labelled[name] = index[wnid]
    unlabelled = sorted(images - set(labelled), key=_natural)
    if unlabelled:
        raise DataError(
            f"{len(unlabelled)} image(s) in val/images of {tree.where} have no line in "
            f"val/val_annotations.txt (first: {unlabelled[0]}); {_FIX}"
        )
    if not labelled:
        raise DataError(f"{tree.where} has no validation images in val/images; {_FIX}")
    names = sorted(labelled, key=_natural)
    return [f"val/images/{n}" for n in names], [labelled[n] for n in names]


class TinyImageNetSource(ImageFolderSource):
    """Tiny-ImageNet-200, one split, read in place from the zip archive or the folder.

    Parameters
    ----------
    path : str or os.PathLike
        ``tiny-imagenet-200.zip``, the extracted ``tiny-imagenet-200`` folder, or the folder
        holding it.
    split : {"train", "test", "val", "validation"}, default "train"
        ``test``, ``val`` and ``validation`` all mean the labelled validation set.
    resize : tuple of int (height, width) or None, default None
        Resize every image (bilinear); ``None`` keeps 64×64.
    name : str or None
        Name used in messages and cache keys; default ``"tiny-imagenet"``.

    Attributes
    ----------
    classes : tuple of str
        The 200 wnids, sorted; label ``c`` refers to ``classes[c]``.
    class_names : tuple of str
        Human-readable names from ``words.txt``, aligned with ``classes``.
    labels : ndarray of int64, shape (n,)
        Label of every image (train: ordered by class, then by file name; test: by file name).
    members : tuple of str
        Archive member names (zip) or paths relative to ``path`` (directory), shape (n,).

    Raises
    ------
    ConfigError
        Unknown split.
    DataError
        A missing or corrupt layout (no ``wnids.txt``, a class without training images,
        annotations naming an unknown wnid or a missing image, ...), with the fix.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        split: str = "train",
        *,
        resize: tuple[int, int] | None = None,
        name: str | None = None,
    ) -> None:
        if split not in _SPLITS:
            raise ConfigError(
                f"Tiny-ImageNet has splits train and test (= the labelled val/ set, also "
                f"accepted as 'val' or 'validation'); got split {split!r}"
            )
        self.path = Path(path).expanduser()
        if not self.path.exists():
            raise DataError(
                f"Tiny-ImageNet path '{self.path}' does not exist; point to the official "
                f"tiny-imagenet-200.zip or its extracted folder ({TINY_IMAGENET_LAYOUT})"
            )
        self.is_zip = not self.path.is_dir()
        if self.is_zip and not zipfile.is_zipfile(self.path):
            raise DataError(
                f"Tiny-ImageNet path '{self.path}' is neither a directory nor a zip archive; "
                f"{_FIX}"
            )
        self.split = split
        self.resize = check_resize(resize)
        self._zip: zipfile.ZipFile | None = None
        self._zip_pid: int | None = None
        tree = _zip_tree(self._archive(), self.path) if self.is_zip else _dir_tree(self.path)
        wnids = _read_wnids(tree)
        if _SPLITS[split] == "train":
            members, labels = _train_listing(tree, wnids)
        else:
            members, labels = _val_listing(tree, wnids)
        self.members = tuple(tree.prefix + m for m in members)
        self.labels: NDArray[np.int64] = np.asarray(labels, dtype=np.int64)
        self.labels.setflags(write=False)
        self.classes: tuple[str, ...] = wnids
        self.class_names: tuple[str, ...] = _read_words(tree, wnids)
        self.name = name if name is not None else "tiny-imagenet"
        self._first_shape: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return (
            f"TinyImageNetSource(path='{self.path}', split={self.split!r}, n={len(self)}, "
            f"classes={len(self.classes)})"
        )
