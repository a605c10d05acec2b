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
