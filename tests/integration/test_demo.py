"""`ghofl demo` end to end at a tiny size: a small CIFAR-10 python archive made here (official
format), a private cache and a small stand-in encoder (the real one is exercised by
tests/integration/test_runner.py and benchmarks/bench_demo.py); plus the errors of a machine
without the data and without internet (as a subprocess)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers_data import cifar_archive_members, make_cifar_archive

pytestmark = pytest.mark.slow

HEADS = ("nb", "lda", "qda")  # one per upload mode; 'all' is checked in tests/unit/test_demo.py
FAST = ["--resolution", "32", "--rounds", "3", "--no-progress", "--heads", ",".join(HEADS),
        "--train-per-class", "0", "--test-per-class", "0"]


class PixelEncoder:
    """A fixed random map of 16x16-pooled pixels to d=300 (tanh): EfficientNet-Lite0's place in
    the demo's plumbing at a size where every head fits in a moment."""

    name, dim = "efficientnet-lite0", 300

    def __init__(self) -> None:
        from ghofl.stats.meta import EncoderInfo

        self.info = EncoderInfo(name="pixels-test", dim=300, preprocessing="pool16-tanh",
                                resolution=32)
        self._w = np.random.default_rng(0).normal(size=(768, 300)) / 30.0

    def embed(self, batch: Any) -> np.ndarray:
        x = np.asarray(batch, np.float64).reshape(len(batch), 16, 2, 16, 2, 3).mean((2, 4))
        z = np.tanh((x.reshape(len(batch), -1) / 255.0 - 0.5) @ self._w)
        return np.asarray(z, dtype=np.float32)


def _demo(args: list[str], tmp: Path, data: Path | None,
          **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "GHOFL_CACHE_DIR": str(tmp / "cache"), **env}
    full.pop("GHOFL_DATA_DIR", None)
    if data is not None:
        full["GHOFL_DATA_DIR"] = str(data)
    return subprocess.run([sys.executable, "-m", "ghofl.cli.main", "demo", *args],
                          capture_output=True, text=True, env=full, timeout=300)


@pytest.fixture(scope="module")
def tiny_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """``ghofl demo`` in process on a small archive, with :class:`PixelEncoder`."""
    import ghofl.client.encoders as encoders
    from ghofl.cli.main import main

    tmp = tmp_path_factory.mktemp("demo")
    make_cifar_archive(tmp / "data" / "cifar-10-python.tar.gz",
                       cifar_archive_members(per_batch=20, n_test=30))
    out = tmp / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(encoders, "get_encoder", lambda *_a, **_k: PixelEncoder())
        mp.setenv("GHOFL_CACHE_DIR", str(tmp / "cache"))
        mp.setenv("GHOFL_DATA_DIR", str(tmp / "data"))
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["demo", *FAST, "--out", str(out)])
    assert rc == 0
    yield out, buf.getvalue()


def test_demo_writes_the_three_pictures_and_the_tables(
    tiny_demo: tuple[Path, str],
) -> None:
    out, stdout = tiny_demo
    assert sorted(p.name for p in out.glob("*.png")) == [
        "accuracy_vs_alpha.png", "accuracy_vs_bytes.png", "fedavg_rounds.png"]
    res = json.loads((out / "results.json").read_text())
    fed = [r for r in res["records"] if r["mode"] != "reference"]
    full = [r for r in fed if r["mode"] == "full" and not r["projection_dim"]]
    assert {r["alpha"] for r in full} == {0.05, 0.1, 0.5}
    assert {r["head"] for r in full} == set(HEADS)
    for head in HEADS:  # partition invariance: one accuracy per head across α
        assert len({r["accuracy"] for r in full if r["head"] == head}) == 1, head
    settings = {(r["mode"], r["projection_dim"]) for r in fed if r["alpha"] == 0.1}
    assert settings == {(m, k) for m in ("diag", "pooled", "full") for k in (None, 256, 64)}
    assert {r["head"] for r in res["records"] if r["mode"] == "reference"} == {
        "logreg", "sklearn_lda"}
    fedavg = res["fedavg"]
    assert len(fedavg["accuracy"]) == 4 and fedavg["alpha"] == 0.1
    assert res["n_train"] == 100 and res["n_test"] == 30
    md = (out / "results.md").read_text()
    assert "| head | α=0.05 | α=0.1 | α=0.5 | spread |" in md
    assert re.search(r"FedAvg \(linear softmax head, lr [0-9.]+ chosen on held-out rows\) on "
                     r"the same 10 clients \(α=0.1\) (does not reach|reaches) the best one-shot "
                     r"head", md)
    assert "| mode | projection | upload per client |" in md
    assert md in stdout and "accuracy_vs_bytes.png" in stdout
    assert (out / "runs" / "alpha" / "results.json").is_file()
    # the archive's pixels are cached under their own key, apart from the zip's 'cifar10'
    keys = {p.name for p in (out.parent / "cache" / "embeddings").iterdir()}
    assert keys == {"cifar10-python"}


def test_demo_without_data_or_internet_says_what_to_download(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/cifar-10-python.tar.gz"
    proc = _demo([*FAST, "--out", str(tmp_path / "o")], tmp_path, None, GHOFL_CIFAR10_URL=url)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.search(rf"could not download {re.escape(url)} \(.*\); without internet access, "
                     rf"download {re.escape(url)} yourself \(MD5 c58f30108f718f92721af3b95e74349a"
                     rf"\) and put it, unchanged, at '.*/cache/data/cifar-10-python.tar.gz' \(or "
                     r"in the folder named by GHOFL_DATA_DIR\)", proc.stderr), proc.stderr
    assert not (tmp_path / "o" / "results.json").exists()
    proc = _demo([*FAST, "--no-download"], tmp_path, tmp_path, GHOFL_CIFAR10_URL=url)
    assert proc.returncode == 2
    assert re.search(r"CIFAR-10 was not found and --no-download was given; download "
                     r"https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz \(MD5 "
                     r"c58f30108f718f92721af3b95e74349a, about 163 MiB\) and put it, unchanged, "
                     rf"at '{re.escape(str(tmp_path))}/cifar-10-python.tar.gz' or ",
                     proc.stderr), proc.stderr
