"""The pieces of ``ghofl predict``: item readers (images, text lines, streamed embedding rows),
batching with unreadable items, output rows (CSV and JSON Lines with the same content), the
encoder fingerprint check."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from ghofl.data.items import EmbeddingRows, ImageItems, Item, TextLineItems
from ghofl.errors import ConfigError, DataError, InputError
from ghofl.evaluation.predict import (
    RowWriter,
    check_encoder_fingerprint,
    embed_items,
    iter_batches,
    output_columns,
    output_format,
    prediction_rows,
)
from ghofl.stats.meta import EncoderInfo
from tests.helpers_data import encode_png, make_image_folder, make_image_zip, random_images

CLASSES = ("a", "b", "c", "d")


def _proba(n: int, seed: int) -> np.ndarray:
    p = np.random.default_rng(seed).dirichlet(np.ones(len(CLASSES)), size=n)
    return p


@pytest.mark.parametrize("block", [1, 3, 7, 100])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
def test_embedding_rows_stream_equals_the_array(tmp_path: Path, block: int,
                                                dtype: type) -> None:
    x = (np.random.default_rng(0).standard_normal((17, 5)) * 100).astype(dtype)
    for name, save in (("plain.npz", np.savez), ("packed.npz", np.savez_compressed)):
        save(tmp_path / name, x=x, y=np.zeros(17))
        rows = EmbeddingRows(tmp_path / name)
        assert (rows.n, rows.dim, rows.encoder) == (17, 5, None)
        blocks = list(rows.blocks(block))
        assert all(b.shape[0] <= block for b in blocks)
        np.testing.assert_array_equal(np.vstack(blocks), x)


def test_embedding_rows_fortran_order_and_encoder_record(tmp_path: Path) -> None:
    x = np.asfortranarray(np.arange(24, dtype=np.float64).reshape(6, 4))
    info = EncoderInfo("enc", 4, "h", "p", 32)
    np.savez(tmp_path / "f.npz", x=x, encoder=np.asarray(json.dumps(info.to_dict())))
    rows = EmbeddingRows(tmp_path / "f.npz")
    np.testing.assert_array_equal(np.vstack(list(rows.blocks(4))), x)
    assert rows.encoder is not None and EncoderInfo.from_dict(rows.encoder) == info


def test_embedding_rows_errors(tmp_path: Path) -> None:
    np.savez(tmp_path / "nox.npz", y=np.zeros(3))
    with pytest.raises(InputError, match=r"nox\.npz' has no array 'x' \(it holds: y\)"):
        EmbeddingRows(tmp_path / "nox.npz")
    np.savez(tmp_path / "flat.npz", x=np.zeros(3))
    with pytest.raises(InputError, match=r"x must be a 2-D numeric array \(n, d\); got shape "
                       r"\(3,\)"):
        EmbeddingRows(tmp_path / "flat.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match=r"bad\.npz' is not a readable \.npz archive"):
        EmbeddingRows(tmp_path / "bad.npz")


def test_image_items_folder_zip_and_file(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    imgs = random_images(3, (5, 4), seed=1)
    files = {"x/1.png": imgs[0], "x/y/2.png": imgs[1], "0.png": imgs[2]}
    folder = make_image_folder(tmp_path / "f", files)
    (folder / "notes.txt").write_text("not an image")
    (folder / ".hidden").mkdir()
    (folder / ".hidden" / "3.png").write_bytes(encode_png(imgs[0]))
    items = list(ImageItems(folder))
    assert [i.id for i in items] == ["0.png", "x/1.png", "x/y/2.png"]
    np.testing.assert_array_equal(items[1].value, imgs[0])
    archive = make_image_zip(tmp_path / "f.zip", dict(files), top="")
    assert [i.id for i in ImageItems(archive)] == ["0.png", "x/1.png", "x/y/2.png"]
    (one,) = list(ImageItems(folder / "0.png"))
    assert one.id == "0.png" and one.error == ""
    np.testing.assert_array_equal(one.value, imgs[2])


def test_image_items_errors_and_corrupt(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty' holds no image files"):
        ImageItems(tmp_path / "empty")
    (tmp_path / "a.bin").write_bytes(b"x")
    with pytest.raises(DataError, match=r"is neither an image file .* a folder nor a \.zip"):
        ImageItems(tmp_path / "a.bin")
    folder = make_image_folder(tmp_path / "f", {"ok.png": random_images(1)[0]})
    (folder / "bad.png").write_bytes(b"garbage")
    items = list(ImageItems(folder))
    assert items[0].id == "bad.png" and items[0].value is None
    assert "is corrupt or not an image Pillow can decode" in items[0].error
    assert items[1].error == ""


def test_text_line_items(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbffirst\r\n\n  \nsecond \xff\nthird\n")
    src = TextLineItems(path)
    items = list(src)
    assert len(src) == 3
    assert [(i.id, i.value) for i in items] == [("1", "first"), ("4", None), ("5", "third")]
    assert items[1].error.startswith(f"line 4 of '{path}' is not valid UTF-8")


def _items(errors: set[int], n: int = 7) -> list[Item]:
    return [Item(str(i), None, "broken") if i in errors else Item(str(i), f"t{i}")
            for i in range(n)]


def test_iter_batches_sizes_and_unreadable() -> None:
    batches = list(iter_batches(_items(set()), 3, skip_unreadable=False, on_skip=print))
    assert [[i.id for i in b] for b in batches] == [["0", "1", "2"], ["3", "4", "5"], ["6"]]
    skipped: list[str] = []
    batches = list(iter_batches(_items({1, 5}), 3, skip_unreadable=True,
                                on_skip=lambda it: skipped.append(it.id)))
    assert [[i.id for i in b] for b in batches] == [["0", "2", "3"], ["4", "6"]]
    assert skipped == ["1", "5"]
    with pytest.raises(DataError, match=r"item '5' is unreadable: broken; nothing was written "
                       r"\(pass --skip-unreadable"):
        list(iter_batches(_items({5}), 2, skip_unreadable=False, on_skip=print))
    with pytest.raises(ConfigError, match="--batch-size must be >= 1; got 0"):
        list(iter_batches(_items(set()), 0, skip_unreadable=False, on_skip=print))


def test_embed_items_groups_image_sizes() -> None:
    from ghofl.client.encoders import CallableEncoder

    sizes: list[tuple[int, ...]] = []

    def fn(batch: np.ndarray) -> np.ndarray:
        sizes.append(batch.shape)
        return batch.astype(np.float32).mean(axis=(1, 2))

    enc = CallableEncoder(fn, "mean", 3, resolution=8)
    imgs = [random_images(1, s, seed=i)[0] for i, s in enumerate([(4, 4), (5, 3), (4, 4)])]
    out = embed_items(enc, [Item(str(i), v) for i, v in enumerate(imgs)])
    np.testing.assert_allclose(out, [v.astype(np.float32).mean(axis=(0, 1)) for v in imgs])
    assert sorted(sizes) == [(1, 5, 3, 3), (2, 4, 4, 3)]


@pytest.mark.parametrize("top_k", [None, 1, 3])
def test_rows_csv_and_jsonl_same_content(top_k: int | None) -> None:
    proba = _proba(5, seed=2)
    scores = np.array([0.5, 12.0, 3.25, 99.0, 1e-3])
    rows = prediction_rows([f"i{j}" for j in range(5)], proba, CLASSES, top_k=top_k,
                           ood_score=scores, threshold=10.0)
    cols = output_columns(CLASSES, top_k, True)
    assert all(list(r) == cols for r in rows)
    assert [r["label"] for r in rows] == [CLASSES[j] for j in proba.argmax(axis=1)]
    assert [r["ood"] for r in rows] == [False, True, False, True, False]
    if top_k:
        order = np.argsort(-proba, axis=1)
        assert [r[f"top{top_k}"] for r in rows] == [CLASSES[o[top_k - 1]] for o in order]
        assert [r["p_top1"] for r in rows] == proba.max(axis=1).tolist()
    else:
        assert [r["p_c"] for r in rows] == proba[:, 2].tolist()
    texts = {}
    for fmt in ("csv", "jsonl"):
        buf = io.StringIO()
        RowWriter(buf, fmt, cols).write(rows)
        texts[fmt] = buf.getvalue()
    parsed = [json.loads(line) for line in texts["jsonl"].splitlines()]
    assert parsed == rows
    from_csv = [{k: v if k == "id" or k == "label" or (k.startswith("top")) else json.loads(v)
                 for k, v in r.items()} for r in csv.DictReader(io.StringIO(texts["csv"]))]
    assert from_csv == rows


def test_rows_without_ood_and_output_format() -> None:
    rows = prediction_rows(["x"], _proba(1, 0), CLASSES)
    assert list(rows[0]) == ["id", "label", "p_a", "p_b", "p_c", "p_d"]
    assert output_format(Path("p.CSV")) == "csv" and output_format(Path("p.jsonl")) == "jsonl"
    with pytest.raises(ConfigError, match=r"--out 'p\.json' must end in \.csv or \.jsonl .*"
                       r"got '\.json'"):
        output_format(Path("p.json"))
    with pytest.raises(ConfigError, match="got 'no extension'"):
        output_format(Path("predictions"))


def test_fingerprint_check() -> None:
    rec = EncoderInfo("enc", 4, "w1", "resize", 32)
    check_encoder_fingerprint(rec, rec, "'m'")
    sqrt = EncoderInfo("enc", 4, "w1", "resize; then sqrt", 32)
    check_encoder_fingerprint(rec, sqrt, "'m'")  # the recorded transform is applied first
    other = EncoderInfo("enc", 4, "w2", "resize", 64)
    with pytest.raises(InputError, match=(
            rf"the local encoder 'enc' has fingerprint {other.fingerprint()}, but the model in "
            rf"'m' was fitted on embeddings of encoder fingerprint {rec.fingerprint()} \('enc'; "
            r"they differ in weights_hash, resolution\); install the encoder the clients used")):
        check_encoder_fingerprint(other, rec, "'m'")
