"""CIFAR-10 python archive: the reader (on small archives in the official format, built here),
its restricted unpickler (a malicious pickle runs nothing), the registry's choice of source, and
the download (a local HTTP server on 127.0.0.1: progress, resume, MD5 check, offline errors)."""

from __future__ import annotations

import hashlib
import http.server
import os
import pickle
import re
import socket
import struct
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from ghofl.data.cifar_archive import (
    CIFAR10_MD5,
    CIFAR10_URL,
    CIFAR10_URL_ENV,
    CifarArchiveSource,
    cached_archive_path,
    cifar10_url,
    ensure_cifar10_archive,
    read_cifar10_archive,
    safe_unpickle,
)
from ghofl.data.download import download_file, file_md5
from ghofl.errors import DataError
from tests.helpers_data import (
    CIFAR_CLASSES,
    cifar_archive_members,
    cifar_batch,
    make_cifar_archive,
    make_image_zip,
    py2_pickle,
)

# ----------------------------------------------------------------------------- reader


@pytest.fixture()
def archive(tmp_path: Path) -> Path:
    return make_cifar_archive(tmp_path / "data" / "cifar-10-python.tar.gz")


def test_reader_returns_canonical_pixels_labels_and_classes(archive: Path) -> None:
    train = read_cifar10_archive(archive, "train")
    assert isinstance(train, CifarArchiveSource)
    assert train.images.shape == (20, 32, 32, 3) and train.images.dtype == np.uint8
    assert train.classes == CIFAR_CLASSES and train.cache_key == "cifar10-python"
    for i in range(5):  # data_batch_1..5 in order, channel-major rows turned into (H, W, 3)
        x, y = cifar_batch(4, seed=i)
        np.testing.assert_array_equal(train.images[4 * i : 4 * i + 4], x)
        np.testing.assert_array_equal(train.labels[4 * i : 4 * i + 4], y)
    test = read_cifar10_archive(archive, "test")
    x, y = cifar_batch(6, seed=5)
    np.testing.assert_array_equal(test.images, x)
    np.testing.assert_array_equal(test.labels, y)
    np.testing.assert_array_equal(test.load_batch([2, 0]), x[[2, 0]])


def test_reader_accepts_the_extracted_folder(archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "extracted"
    with tarfile.open(archive) as tf:
        tf.extractall(out, filter="data")
    want = read_cifar10_archive(archive, "test")
    for p in (out, out / "cifar-10-batches-py"):
        got = read_cifar10_archive(p, "test")
        np.testing.assert_array_equal(got.images, want.images)
        np.testing.assert_array_equal(got.labels, want.labels)


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _evil_pickles(marker: Path) -> dict[str, bytes]:
    """Pickles that, loaded with plain ``pickle.loads``, create ``marker`` (the first two),
    read a file or allocate what they like."""
    code = f"open({str(marker)!r}, 'w').close()".encode()
    return {
        "os.system": pickle.dumps({b"label_names": _Evil(marker)}, protocol=2),
        "builtins.exec": b"\x80\x02cbuiltins\nexec\nX" + struct.pack("<I", len(code)) + code
        + b"\x85R.",
        "numpy.load": b"\x80\x02cnumpy\nload\nU\x01x\x85R.",
        "ndarray called": b"\x80\x02cnumpy\nndarray\nJ\x00\xe1\xf5\x05\x85R.",
        "object dtype": b"\x80\x02cnumpy\ndtype\nU\x02O8K\x00K\x01\x87R.",
    }


@pytest.mark.parametrize("kind", ["os.system", "builtins.exec", "numpy.load", "ndarray called",
                                  "object dtype"])
def test_a_malicious_pickle_is_refused_unexecuted(
    kind: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    members = cifar_archive_members()
    members["batches.meta"] = _evil_pickles(marker)[kind]
    path = make_cifar_archive(tmp_path / "evil.tar.gz", members)
    with pytest.raises(DataError, match=r"batches.meta\) is not a genuine CIFAR-10 batch .*"
                       r"nothing in it was run\. Delete the file and download "):
        read_cifar10_archive(path, "test")
    assert not marker.exists()
    assert pickle.loads(pickle.dumps(1)) == 1  # the global pickle module is untouched


def test_safe_unpickle_reads_python2_batches() -> None:
    data = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3072)
    obj = safe_unpickle(py2_pickle({"data": data, "labels": [1, 2], "x": (None, True, 300)}),
                        "batch")
    np.testing.assert_array_equal(obj[b"data"], data)
    assert obj[b"labels"] == [1, 2] and obj[b"x"] == (None, True, 300)


def _with(member: str, payload: bytes) -> dict[str, bytes]:
    members = cifar_archive_members()
    members[member] = payload
    return members


@pytest.mark.parametrize(
    ("members", "match"),
    [
        ({k: v for k, v in cifar_archive_members().items() if k != "data_batch_3"},
         r"lacks data_batch_3, so it is not a complete CIFAR-10 python archive"),
        (_with("data_batch_2", py2_pickle({"data": np.zeros((2, 100), np.uint8),
                                           "labels": [0, 1]})),
         r"\(data_batch_2\): 'data' must be a uint8 array of shape \(n, 3072\); got dtype "
         r"uint8, shape \(2, 100\)"),
        (_with("data_batch_1", py2_pickle({"data": np.zeros((2, 3072), np.uint8),
                                           "labels": [0]})),
         r"'labels' must be a list of 2 ints"),
        (_with("data_batch_1", py2_pickle({"data": np.zeros((2, 3072), np.uint8),
                                           "labels": [0, 10]})),
         r"labels must lie in \[0, 10\); got values from 0 to 10"),
        (_with("batches.meta", py2_pickle({"label_names": []})),
         r"'label_names' must be a non-empty list of class names"),
        (_with("data_batch_1", py2_pickle([1, 2])),
         r"holds a list, not the dict of a CIFAR-10 batch"),
    ],
)
def test_damaged_archives_fail_clearly(
    members: dict[str, bytes], match: str, tmp_path: Path
) -> None:
    path = make_cifar_archive(tmp_path / "bad.tar.gz", members)
    with pytest.raises(DataError, match=match):
        read_cifar10_archive(path, "train")


def test_truncated_archive_and_oversized_member(
    archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(archive.read_bytes()[:300])
    with pytest.raises(DataError, match=r"is not a readable .tar.gz archive .*download "
                       + re.escape(CIFAR10_URL)):
        read_cifar10_archive(cut, "train")
    import ghofl.data.cifar_archive as ca

    monkeypatch.setattr(ca, "_MAX_MEMBER_BYTES", 1000)
    with pytest.raises(DataError, match=r"far more than a CIFAR-10 batch"):
        read_cifar10_archive(archive, "train")
    with pytest.raises(DataError, match=r"has splits 'train' and 'test'; got split 'val'"):
        read_cifar10_archive(archive, "val")
    with pytest.raises(DataError, match=r"is neither cifar-10-python.tar.gz nor a "
                       r"cifar-10-batches-py folder"):
        read_cifar10_archive(tmp_path / "nothing", "train")


# ----------------------------------------------------------------------------- registry


def test_registry_prefers_the_zip_then_the_archive_then_the_cache(
    archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ghofl.data.images import ImageFolderSource
    from ghofl.data.registry import load_dataset
    from tests.helpers_data import layout_files

    cache = tmp_path / "cache"
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(cache))
    monkeypatch.delenv("GHOFL_DATA_DIR", raising=False)
    data = archive.parent
    src = load_dataset("cifar10", "test", data_dir=data)
    assert isinstance(src, CifarArchiveSource) and len(src) == 6

    make_image_zip(data / "cifar10.zip", layout_files(split="test"), top="cifar10")
    zsrc = load_dataset("cifar10", "test", data_dir=data)  # the zip stays the default
    assert isinstance(zsrc, ImageFolderSource) and zsrc.name == "cifar10"

    with pytest.raises(DataError, match=r"GHOFL_DATA_DIR is not set, so there is no cifar10.zip "
                       r".*`ghofl demo` downloads the archive by itself, or download "
                       + re.escape(CIFAR10_URL) + r" \(MD5 " + CIFAR10_MD5):
        load_dataset("cifar10", "test")
    cached = cached_archive_path()
    cached.parent.mkdir(parents=True)
    cached.write_bytes(archive.read_bytes())
    assert isinstance(load_dataset("cifar10", "train"), CifarArchiveSource)  # no data dir needed
    with pytest.raises(DataError, match=r"'.*missing' is not a directory"):
        load_dataset("cifar10", "test", data_dir=tmp_path / "missing")


def test_embedding_cache_keys_differ_between_the_two_sources(
    archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ghofl.bench.config import ExperimentConfig
    from ghofl.bench.features import load_features
    from ghofl.stats.meta import EncoderInfo

    class MeanColour:
        name, dim = "mean-colour", 3
        info = EncoderInfo(name="mean-colour", dim=3, preprocessing="mean", resolution=32)

        def embed(self, batch: Any) -> Any:
            return np.asarray(batch, np.float32).mean(axis=(1, 2))

    import ghofl.client.encoders as encoders

    monkeypatch.setattr(encoders, "get_encoder", lambda *_a, **_k: MeanColour())
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ExperimentConfig(datasets=("cifar10",), data_dir=str(archive.parent))
    feats = load_features("cifar10", "mean-colour", cfg)
    assert feats.x_train.shape == (20, 3)
    keys = {p.name for p in (tmp_path / "cache" / "embeddings").iterdir()}
    assert keys == {"cifar10-python"}


# ----------------------------------------------------------------------------- download


class _Handler(http.server.BaseHTTPRequestHandler):
    files: ClassVar[dict[str, bytes]] = {}
    seen_ranges: ClassVar[list[str]] = []
    cut_after: ClassVar[int | None] = None  # send a full Content-Length but only this many bytes

    def do_GET(self) -> None:
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        start = 0
        rng = self.headers.get("Range")
        if rng:
            self.seen_ranges.append(rng)
            start = int(rng.removeprefix("bytes=").rstrip("-"))
            if start >= len(body):
                self.send_error(416, "Range Not Satisfiable")
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        part = body[start:]
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        if self.cut_after is not None:
            part = part[: self.cut_after]
            self.close_connection = True
        self.wfile.write(part)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("H", (_Handler,), {"files": {}, "seen_ranges": [], "cut_after": None})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def test_download_checks_md5_shows_progress_and_leaves_no_temporary(
    server: tuple[str, type[_Handler]], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    url, handler = server
    payload = os.urandom(300_000)
    handler.files["/f.bin"] = payload
    dest = tmp_path / "dl" / "f.bin"
    got = download_file(f"{url}/f.bin", dest, md5=_md5(payload), desc="test file",
                        chunk_size=4096)
    assert got == dest and dest.read_bytes() == payload and file_md5(dest) == _md5(payload)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["f.bin", "f.bin.lock"]
    err = capfd.readouterr().err
    assert "test file" in err and "100%" in err
    handler.files["/f.bin"] = b"changed"  # present and intact: no second download
    assert download_file(f"{url}/f.bin", dest, md5=_md5(payload), progress=False) == dest


def test_md5_mismatch_deletes_the_download(
    server: tuple[str, type[_Handler]], tmp_path: Path
) -> None:
    url, handler = server
    handler.files["/f.bin"] = b"not the archive"
    dest = tmp_path / "f.bin"
    with pytest.raises(DataError, match=rf"the file downloaded from {re.escape(url)}/f.bin has "
                       rf"MD5 {_md5(b'not the archive')}, not {'a' * 32}, so it was deleted; run "
                       rf"again, or download {re.escape(url)}/f.bin yourself \(MD5 {'a' * 32}\) "
                       rf"and put it at '{re.escape(str(dest))}'"):
        download_file(f"{url}/f.bin", dest, md5="a" * 32, progress=False)
    assert not dest.exists() and not dest.with_name("f.bin.part").exists()


def test_offline_and_http_errors_say_what_to_download_and_where(
    server: tuple[str, type[_Handler]], tmp_path: Path
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = f"http://127.0.0.1:{port}/cifar-10-python.tar.gz"
    with pytest.raises(DataError, match=rf"could not download {re.escape(dead)} \(.*\); without "
                       rf"internet access, download {re.escape(dead)} yourself \(MD5 "
                       rf"{CIFAR10_MD5}\) and put it, unchanged, at '.*cifar-10-python.tar.gz'"):
        ensure_cifar10_archive(None, cache_dir=tmp_path / "c", url=dead, progress=False)
    url, _ = server
    with pytest.raises(DataError, match=r"could not download .*/missing \(HTTP 404 Not Found\)"):
        download_file(f"{url}/missing", tmp_path / "m", md5="0" * 32, progress=False)
    with pytest.raises(DataError, match=r"md5 must be 32 hex digits; got 'xyz'"):
        download_file(f"{url}/missing", tmp_path / "m", md5="xyz")


def test_an_interrupted_download_resumes_with_a_range_request(
    server: tuple[str, type[_Handler]], tmp_path: Path
) -> None:
    url, handler = server
    payload = os.urandom(200_000)
    handler.files["/f.bin"] = payload
    handler.cut_after = 50_000
    dest = tmp_path / "f.bin"
    with pytest.raises(DataError, match=r"the download of .*/f.bin stopped after 50,000 "
                       r"(of 200,000 )?bytes.*run again to resume it"):
        download_file(f"{url}/f.bin", dest, md5=_md5(payload), progress=False)
    assert dest.with_name("f.bin.part").stat().st_size == 50_000 and not dest.exists()
    handler.cut_after = None
    download_file(f"{url}/f.bin", dest, md5=_md5(payload), progress=False)
    assert dest.read_bytes() == payload and handler.seen_ranges == ["bytes=50000-"]


def test_a_partial_file_longer_than_the_server_file_restarts(
    server: tuple[str, type[_Handler]], tmp_path: Path
) -> None:
    url, handler = server
    handler.files["/f.bin"] = b"abc"
    dest = tmp_path / "f.bin"
    dest.with_name("f.bin.part").write_bytes(b"0123456789")
    download_file(f"{url}/f.bin", dest, md5=_md5(b"abc"), progress=False)
    assert dest.read_bytes() == b"abc"


def test_an_existing_file_with_another_md5_is_not_overwritten(tmp_path: Path) -> None:
    dest = tmp_path / "f.bin"
    dest.write_bytes(b"mine")
    with pytest.raises(DataError, match=r"exists but its MD5 is .*delete it and run again"):
        download_file("http://127.0.0.1:9/f.bin", dest, md5="0" * 32, progress=False)
    assert dest.read_bytes() == b"mine"


def test_ensure_downloads_once_into_the_cache(
    server: tuple[str, type[_Handler]], archive: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    url, handler = server
    blob = archive.read_bytes()
    handler.files["/mirror/cifar-10-python.tar.gz"] = blob
    monkeypatch.setenv(CIFAR10_URL_ENV, f"{url}/mirror/cifar-10-python.tar.gz")
    assert cifar10_url() == f"{url}/mirror/cifar-10-python.tar.gz"
    cache = tmp_path / "cache"
    got = ensure_cifar10_archive(tmp_path / "empty", cache_dir=cache, md5=_md5(blob),
                                 progress=False)
    assert got == cached_archive_path(cache) and got.read_bytes() == blob
    handler.files.clear()  # found in the cache now: no request
    assert ensure_cifar10_archive(None, cache_dir=cache, md5=_md5(blob)) == got
    # the data directory's copy wins over the cache
    assert ensure_cifar10_archive(archive.parent, cache_dir=cache) == archive
    monkeypatch.delenv(CIFAR10_URL_ENV)
    assert cifar10_url() == CIFAR10_URL
