"""Makers of tiny on-disk datasets for the reader, encoder and cache tests.

Import as ``from tests.helpers_data import ...``. Everything is seeded and written under a
pytest ``tmp_path``; nothing is downloaded.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

REPO = Path(__file__).resolve().parents[1]


def real_data_dir() -> Path | None:
    """``$GHOFL_DATA_DIR`` if set and a directory, else ``../shared/data`` beside the repo."""
    env = os.environ.get("GHOFL_DATA_DIR")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if cand.is_dir():
            return cand
    return None


def real_cifar_zip() -> Path | None:
    """The real ``cifar10.zip`` or ``None`` when absent."""
    root = real_data_dir()
    if root is None or not (root / "cifar10.zip").is_file():
        return None
    return root / "cifar10.zip"


def random_images(n: int, size: tuple[int, int] = (8, 8), seed: int = 0) -> NDArray[np.uint8]:
    """Seeded uint8 RGB images of shape (n, H, W, 3)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, *size, 3), dtype=np.uint8)


def encode_png(img: NDArray[np.uint8]) -> bytes:
    """Lossless PNG bytes of one (H, W, 3) uint8 image."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def layout_files(
    classes: Sequence[str] = ("dog", "cat"),
    n_per_class: int = 3,
    size: tuple[int, int] = (8, 8),
    split: str = "train",
    seed: int = 0,
) -> dict[str, NDArray[np.uint8]]:
    """Relative path ``<split>/<class>/<i>.png`` -> image, for every class."""
    out: dict[str, NDArray[np.uint8]] = {}
    for c, name in enumerate(classes):
        imgs = random_images(n_per_class, size, seed=seed * 1000 + c)
        for i, img in enumerate(imgs):
            out[f"{split}/{name}/{i:03d}.png"] = img
    return out


def make_image_folder(
    root: Path, files: dict[str, NDArray[np.uint8]], empty_dirs: Sequence[str] = ()
) -> Path:
    """Write ``files`` (relative path -> image) as PNGs under ``root``; create ``empty_dirs``."""
    for rel, img in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_png(img))
    for d in empty_dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
    return root


def make_image_zip(
    path: Path,
    files: dict[str, NDArray[np.uint8] | bytes],
    top: str = "ds",
    empty_dirs: Sequence[str] = (),
) -> Path:
    """Write ``files`` into a zip under the top folder ``top`` (``""`` for none).

    Values are images (written as PNG) or raw bytes (to plant corrupt files).
    """
    prefix = f"{top}/" if top else ""
    with zipfile.ZipFile(path, "w") as zf:
        for rel, data in files.items():
            payload = data if isinstance(data, bytes) else encode_png(data)
            zf.writestr(prefix + rel, payload)
        for d in empty_dirs:
            zf.writestr(prefix + d.rstrip("/") + "/", b"")
    return path


def make_text_data_dir(root: Path) -> Path:
    """A data dir with small ``text/`` files for trec, sst2 and agnews (20 rows per AG class)."""
    text = root / "text"
    text.mkdir(parents=True, exist_ok=True)
    trec = "".join(f"{i % 6} question number {i} ?\n" for i in range(24))
    (text / "TREC.train.all").write_text(trec)
    (text / "TREC.test.all").write_text("DESC:manner How do you do ?\nNUM:date When is it ?\n")
    for split, n in (("train", 10), ("dev", 4), ("test", 6)):
        (text / f"stsa.binary.{split}").write_text(
            "".join(f"{i % 2} sentence {split} {i}\n" for i in range(n))
        )
    rows = ["label,title,description"]
    rows += [f'{1 + i % 4},Title {i},"Body {i}, with a comma"' for i in range(80)]
    (text / "agnews.test.csv").write_text("\n".join(rows) + "\n")
    return root


def encode_jpeg(img: NDArray[np.uint8]) -> bytes:
    """JPEG bytes (quality 95) of one (H, W, 3) uint8 image."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def tiny_imagenet_files(
    wnids: Sequence[str] = ("n02000002", "n01000001", "n03000003"),
    train_ids: Sequence[int] = (0, 1),
    n_val: int = 6,
    size: tuple[int, int] = (8, 8),
    official: bool = False,
    seed: int = 0,
) -> dict[str, bytes]:
    """Files of a small Tiny-ImageNet layout, relative to its ``tiny-imagenet-200`` folder.

    ``wnids.txt`` lists ``wnids`` in the given (unsorted) order; ``words.txt`` names each
    ``<wnid>`` as ``"name of <wnid>"`` plus an unrelated line; every class gets
    ``train/<wnid>/images/<wnid>_<i>.JPEG`` for ``i`` in ``train_ids``; ``val/images/val_<j>.JPEG``
    is labelled ``wnids[j % len(wnids)]`` in ``val/val_annotations.txt`` (with a box, as in
    the official file). ``official=True`` adds what the full archive has besides:
    ``train/<wnid>/<wnid>_boxes.txt`` and unlabelled ``test/images/test_<j>.JPEG``.
    Pass the result to :func:`make_image_zip` (``top="tiny-imagenet-200"``) or
    :func:`write_files`; delete or replace entries to plant a corrupt layout.
    """
    imgs = iter(random_images(len(wnids) * len(train_ids) + 2 * n_val, size, seed=seed))
    files: dict[str, bytes] = {
        "wnids.txt": "".join(f"{w}\n" for w in wnids).encode(),
        "words.txt": "".join(f"{w}\tname of {w}\n" for w in wnids).encode()
        + b"n09999999\tan unrelated synset\n",
    }
    for w in wnids:
        for i in train_ids:
            files[f"train/{w}/images/{w}_{i}.JPEG"] = encode_jpeg(next(imgs))
        if official:
            files[f"train/{w}/{w}_boxes.txt"] = "".join(
                f"{w}_{i}.JPEG\t0\t0\t7\t7\n" for i in train_ids
            ).encode()
    lines = []
    for j in range(n_val):
        files[f"val/images/val_{j}.JPEG"] = encode_jpeg(next(imgs))
        lines.append(f"val_{j}.JPEG\t{wnids[j % len(wnids)]}\t0\t1\t6\t7\n")
    files["val/val_annotations.txt"] = "".join(lines).encode()
    if official:
        for j in range(n_val):
            files[f"test/images/test_{j}.JPEG"] = encode_jpeg(next(imgs))
    return files


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    """Write ``files`` (relative path -> bytes) under ``root``; return ``root``."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _py2_str(b: bytes) -> bytes:
    """A Python 2 ``str`` in a protocol-2 pickle (SHORT_BINSTRING / BINSTRING)."""
    import struct

    return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<i", len(b)) + b)


def _py2_obj(o: object) -> bytes:
    import struct

    if o is None:
        return b"N"
    if isinstance(o, bool):
        return b"\x88" if o else b"\x89"
    if isinstance(o, int):
        return (b"K" + bytes([o])) if 0 <= o < 256 else (b"J" + struct.pack("<i", o))
    if isinstance(o, str):
        return _py2_str(o.encode())
    if isinstance(o, bytes):
        return _py2_str(o)
    if isinstance(o, list):
        return b"](" + b"".join(_py2_obj(v) for v in o) + b"e"
    if isinstance(o, tuple):
        return b"(" + b"".join(_py2_obj(v) for v in o) + b"t"
    if isinstance(o, dict):
        return b"}(" + b"".join(_py2_obj(k) + _py2_obj(v) for k, v in o.items()) + b"u"
    if isinstance(o, np.ndarray) and o.dtype == np.uint8:
        # what numpy under Python 2 wrote: _reconstruct(ndarray, (0,), 'b') then BUILD with
        # (1, shape, dtype('u1', 0, 1) + its state, fortran=False, raw bytes)
        return (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + _py2_obj((0,))
                + _py2_str(b"b") + b"\x87R(K\x01" + _py2_obj(tuple(o.shape))
                + b"cnumpy\ndtype\n" + _py2_obj(("u1", 0, 1)) + b"R"
                + _py2_obj((3, "|", None, None, None, -1, -1, 0)) + b"b\x89"
                + _py2_str(np.ascontiguousarray(o).tobytes()) + b"tb")
    raise TypeError(f"no Python 2 pickle form for {type(o).__name__} here")


def py2_pickle(obj: object) -> bytes:
    """``obj`` pickled as Python 2's cPickle (protocol 2) wrote the CIFAR-10 batches: ``str``
    (and ``bytes``) as Python 2 byte strings, uint8 arrays through numpy's ``_reconstruct``."""
    return b"\x80\x02" + _py2_obj(obj) + b"."


CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                 "ship", "truck")


def cifar_batch(n: int, seed: int, num_classes: int = 10) -> tuple[NDArray[np.uint8],
                                                                    NDArray[np.int64]]:
    """Seeded images (n, 32, 32, 3) whose colour depends on the label, and labels (n,)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n, dtype=np.int64) % num_classes
    rng.shuffle(labels)
    imgs = rng.integers(0, 90, size=(n, 32, 32, 3))
    imgs[..., 0] += 16 * labels[:, None, None]
    imgs[..., 2] += 150 - 15 * labels[:, None, None]
    return imgs.astype(np.uint8), labels


def cifar_archive_members(
    per_batch: int = 4, n_test: int = 6, seed: int = 0, meta: object | None = None
) -> dict[str, bytes]:
    """Member name (under ``cifar-10-batches-py/``) -> bytes of a small CIFAR-10 python archive
    in the official format: ``data_batch_1..5`` with ``per_batch`` images each, ``test_batch``
    with ``n_test``, ``batches.meta`` (or ``meta`` when given), ``readme.html``."""
    out: dict[str, bytes] = {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for i, name in enumerate(names):
        imgs, labels = cifar_batch(n_test if name == "test_batch" else per_batch, seed + i)
        data = imgs.transpose(0, 3, 1, 2).reshape(len(imgs), -1)  # channel-major rows
        out[name] = py2_pickle({"batch_label": f"{name} (ghofl test)", "labels": labels.tolist(),
                                "data": data,
                                "filenames": [f"img_{j}.png" for j in range(len(imgs))]})
    out["batches.meta"] = py2_pickle(
        meta if meta is not None else
        {"num_cases_per_batch": per_batch, "label_names": list(CIFAR_CLASSES), "num_vis": 3072}
    )
    out["readme.html"] = b"<html>test</html>"
    return out


def make_cifar_archive(path: Path, members: dict[str, bytes] | None = None) -> Path:
    """Write ``members`` (default :func:`cifar_archive_members`) as a ``.tar.gz`` at ``path``
    under the folder ``cifar-10-batches-py/``, as the official archive is laid out."""
    import tarfile

    files = members if members is not None else cifar_archive_members()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path
