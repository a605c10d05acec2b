"""Seeded fuzzing of everything ``aggregate``, ``fit`` and ``evaluate`` read from disk.

Four surfaces: the payload reader (:func:`ghofl.stats.load_stats`), the merger
(:func:`ghofl.stats.sum_stats` over payloads that read fine on their own), the aggregation
store (:meth:`AggregationStore.add`) and the model reader (:func:`load_head`,
:func:`load_model`). Inputs are small (C = 3, d = 4) valid files mutated in seeded ways:
truncation, bit flips, header edits (missing/extra/wrong keys, types, versions, shapes that lie,
huge declared sizes, dtypes), data edits (NaN/Inf, negative or huge counts, non-symmetric or
indefinite matrices, moment inequalities violated, values that overflow when summed),
mismatched encoder/projection/clipping bound, non-regular files. Every case must end in a
:class:`~ghofl.errors.GhoflError` whose message is a sentence, within a time bound, without a
memory blow-up, and leave the store unchanged. A few hundred cases go through the CLI
(``ghofl.cli.main.main``) and must print exactly one ``ghofl: error:`` line and exit 2.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import shutil
import signal
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

from ghofl.errors import GhoflError
from ghofl.heads import make_head
from ghofl.heads.registry import load_head
from ghofl.model.directory import MANIFEST, load_model, save_model
from ghofl.stats import ClientStats, EncoderInfo, ProjectionSpec, compute_stats, load_stats
from ghofl.stats.client_stats import sum_stats
from ghofl.stats.codec import write_safetensors
from ghofl.store import AggregationStore
from tests.helpers import gaussian_mixture

C, D = 3, 4
TIME_LIMIT_S = 5.0
MIN_CASES = 10_000
OUTCOMES: Counter[str] = Counter()
FAILURES: list[str] = []
SKIPPED: Counter[str] = Counter()


# ---------------------------------------------------------------------- files
def _split(raw: bytes) -> tuple[dict[str, Any], bytes]:
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _join(header: dict[str, Any], data: bytes) -> bytes:
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + data


def _stats(seed: int, mode: str = "full", **kw: Any) -> ClientStats:
    x, y = gaussian_mixture(seed, num_classes=C, dim=D, n=60)
    return compute_stats(x, y, C, mode=mode, **kw)  # type: ignore[arg-type]


class Corpus:
    """Valid seed files, written once per test session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stats = {m: _stats(1, m) for m in ("full", "pooled", "gram", "diag")}
        self.clipped = _stats(2, "full", clip_norm=50.0)
        from ghofl.stats import save_stats

        self.raw: dict[str, bytes] = {}
        for m, s in self.stats.items():
            save_stats(s, root / f"{m}.ghs")
            self.raw[m] = (root / f"{m}.ghs").read_bytes()
        save_stats(self.clipped, root / "clipped.ghs")
        self.raw["clipped"] = (root / "clipped.ghs").read_bytes()
        heads = {}
        for name in ("nb", "lda", "qda", "fedcgs"):
            heads[name] = make_head(name).fit_from_stats(self.stats["full"])
        self.model = save_model(root / "model", heads, stats_meta=self.stats["full"].meta)
        self.heads = {n: (self.model / f"{n}.ghh").read_bytes() for n in heads}
        self.manifest = (self.model / MANIFEST).read_text()
        x, y = gaussian_mixture(3, num_classes=C, dim=D, n=30)
        np.savez(root / "test.npz", x=x, y=y)


# ---------------------------------------------------------------------- mutations
Mutation = Callable[[np.random.Generator, bytes], bytes]


def truncate(rng: np.random.Generator, raw: bytes) -> bytes:
    return raw[: int(rng.integers(0, len(raw)))]


def bit_flip(rng: np.random.Generator, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(0, len(b)))
        b[i] ^= 1 << int(rng.integers(0, 8))
    return bytes(b)


def append_junk(rng: np.random.Generator, raw: bytes) -> bytes:
    return raw + bytes(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8))


def huge_length(rng: np.random.Generator, raw: bytes) -> bytes:
    n = int(rng.choice([2**63 - 1, 2**40, 10**9, len(raw) * 4]))
    return n.to_bytes(8, "little") + raw[8:]


_META_EDITS: list[Callable[[dict[str, Any], np.random.Generator], None]] = []


def _meta_edit(fn: Callable[[dict[str, Any], np.random.Generator], None]) -> Any:
    _META_EDITS.append(fn)
    return fn


@_meta_edit
def _drop_key(m: dict[str, Any], rng: np.random.Generator) -> None:
    keys = sorted(k for k in m if k != "content_sha256")  # no digest: an older file, tested
    # in tests/unit/test_codec.py
    del m[keys[int(rng.integers(0, len(keys)))]]


@_meta_edit
def _bad_value(m: dict[str, Any], rng: np.random.Generator) -> None:
    keys = sorted(m)
    key = keys[int(rng.integers(0, len(keys)))]
    m[key] = str(rng.choice(["", "null", "[]", "{}", "1e400", "-1", "9" * 5000, "x", "[[[[",
                             '{"a": 1, "a": 2}', "NaN", "true", "3"]))


@_meta_edit
def _bad_inner(m: dict[str, Any], rng: np.random.Generator) -> None:
    if "meta" not in m:
        return
    inner = json.loads(m["meta"])
    key = str(rng.choice(["schema_version", "mode", "dim", "classes", "encoder", "projection",
                          "clip_norm"]))
    inner[key] = rng.choice(np.array(
        ["7", None, [], {}, 1e300, -3, 2**70, "full", [1, 2], True, 0, 99, 4.5, {"x": 1}],
        dtype=object))
    m["meta"] = json.dumps(inner)


@_meta_edit
def _deep_json(m: dict[str, Any], rng: np.random.Generator) -> None:
    key = sorted(m)[int(rng.integers(0, len(m)))]
    depth = int(rng.choice([40, 1000, 100000]))
    m[key] = "[" * depth + "]" * depth


@_meta_edit
def _non_object(m: dict[str, Any], rng: np.random.Generator) -> None:
    for key in ("meta", "params", "scalars"):
        if key in m:
            m[key] = str(rng.choice(["[1, 2]", "3", '"s"', "null", "1e400", "Infinity"]))


def header_edit(rng: np.random.Generator, raw: bytes) -> bytes:
    header, data = _split(raw)
    meta = header.setdefault("__metadata__", {})
    _META_EDITS[int(rng.integers(0, len(_META_EDITS)))](meta, rng)
    return _join(header, data)


def table_edit(rng: np.random.Generator, raw: bytes) -> bytes:
    header, data = _split(raw)
    names = sorted(k for k in header if k != "__metadata__")
    t = header[names[int(rng.integers(0, len(names)))]]
    kind = int(rng.integers(0, 8))
    if kind == 0:
        t["dtype"] = str(rng.choice(["BF16", "F8_E4M3", "F32", "I32", "U8", "BOOL", "I64",
                                     "F64"]))
    elif kind == 1:
        t["shape"] = [int(s) for s in rng.integers(0, 12, int(rng.integers(0, 4)))]
    elif kind == 2:
        t["shape"] = [2**31, 2**31]
        t["data_offsets"] = [0, 8 * 2**62]
    elif kind == 3:
        t["data_offsets"] = [int(v) for v in rng.integers(0, 400, 2)]
    elif kind == 4:
        t["shape"] = []
    elif kind == 5:
        header["extra"] = {"dtype": "F64", "shape": [2**28], "data_offsets": [len(data),
                                                                              len(data) + 2**31]}
    elif kind == 6:
        t["data_offsets"] = "0"
    else:
        del header[names[0]]
    return _join(header, data)


BYTE_MUTATIONS: list[Mutation] = [truncate, bit_flip, append_junk, huge_length, header_edit,
                                  table_edit]


def data_edit_stats(rng: np.random.Generator, base: ClientStats
                    ) -> tuple[dict[str, np.ndarray], str]:
    """Arrays of ``base`` with one semantic corruption (to be re-digested)."""
    from ghofl.stats.codec import stats_tensors

    t = {k: np.array(v) for k, v in stats_tensors(base).items()}
    kind = int(rng.integers(0, 11))
    floats = sorted(k for k in t if k != "counts")
    name = floats[int(rng.integers(0, len(floats)))]
    idx = tuple(int(rng.integers(0, s)) for s in t[name].shape)
    if kind == 0:
        t[name][idx] = rng.choice([np.nan, np.inf, -np.inf])
    elif kind == 1:
        t["counts"][int(rng.integers(0, C))] = -int(rng.integers(1, 100))
    elif kind == 2:
        t["counts"][int(rng.integers(0, C))] = 2**62 + int(rng.integers(0, 2**40))
    elif kind == 3:
        t["counts"][int(rng.integers(0, C))] = 0
    elif kind == 4:  # moment inequality: shrink the second moments
        for k in floats:
            if k != "sums":
                t[k] = t[k] * 1e-3
    elif kind == 5:  # huge values that overflow when summed or squared
        t["sums"] = t["sums"] * float(rng.choice([1e154, 1e200, 1e300]))
    elif kind == 6:  # indefinite second moments (flip the sign of an off-diagonal entry)
        for k in floats:
            if k.endswith("_triu"):
                t[k][..., 1] = -50.0 * np.abs(t[k][..., 0]) - 1.0
    elif kind == 7:
        t[name] = t[name].astype(np.int64)
    elif kind == 8:
        t["counts"] = t["counts"].astype(np.float64) + 0.5
    elif kind == 9:
        if name.endswith("_triu"):  # a diagonal entry: never valid when negative
            idx = (*idx[:-1], int(_DIAG[int(rng.integers(0, len(_DIAG)))]))
        t[name][idx] = -abs(t[name][idx]) - 1e-300
    else:
        t[name] = t[name] * -1.0
    orig = stats_tensors(base)
    if set(t) == set(orig) and all(t[k].dtype == orig[k].dtype and t[k].shape == orig[k].shape
                                   and np.array_equal(t[k], orig[k]) for k in t):
        return t, f"noop:{name}"  # e.g. an edit of second moments a mode does not hold
    return t, f"{kind}:{name}"


_DIAG = np.flatnonzero(np.triu_indices(D)[0] == np.triu_indices(D)[1])


def may_stay_valid(what: str) -> bool:
    """Edits that can leave valid statistics: huge counts alone (N·D ≥ A² still holds), sums
    negated (the data negated), a negative sum, or a negative off-diagonal second moment."""
    kind, name = what.split(":")
    return kind in ("2", "noop") or (kind in ("9", "10") and name == "sums")


def data_edit_head(rng: np.random.Generator, raw: bytes) -> tuple[dict[str, np.ndarray],
                                                                   dict[str, str]]:
    header, data = _split(raw)
    meta = header.pop("__metadata__")
    arrays = {k: np.frombuffer(data, np.float64 if v["dtype"] == "F64" else np.int64,
                               offset=v["data_offsets"][0],
                               count=int(np.prod(v["shape"], dtype=np.int64))).reshape(v["shape"])
              .copy() for k, v in header.items()}
    names = sorted(arrays)
    name = names[int(rng.integers(0, len(names)))]
    kind = int(rng.integers(0, 7))
    if kind == 0:
        arrays[name].reshape(-1)[0] = rng.choice([np.nan, np.inf])
    elif kind == 1:
        arrays[name] = arrays[name][:-1] if arrays[name].shape[0] > 1 else arrays[name][:0]
    elif kind == 2:
        arrays[name] = np.array(1.0)
    elif kind == 3:
        arrays[name] = arrays[name].astype(np.int64)
    elif kind == 4:
        arrays[name] = arrays[name].reshape(-1)[:1].copy()  # broadcastable
    elif kind == 5:
        inner = json.loads(meta["meta"])
        inner["classes"] = ["x", "y", "z"]
        meta["meta"] = json.dumps(inner)
    else:
        arrays["extra_"] = np.zeros(3)
    return arrays, meta


# ---------------------------------------------------------------------- harness
class _Timeout(BaseException):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _Timeout


@contextlib.contextmanager
def _deadline() -> Iterator[None]:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _is_sentence(msg: str) -> bool:
    return len(msg) >= 20 and " " in msg and "\n" not in msg.strip() and "Traceback" not in msg


def run_case(surface: str, label: str, fn: Callable[[], object],
             accept: bool = False, noop: bool = False) -> bool:
    """Run one case: it must raise a GhoflError with a sentence (or, with ``accept``, may
    return normally: a mutation that left the input valid)."""
    key = f"{surface}:{label}"
    if noop:  # the mutation left the input as it was: not a bad input
        SKIPPED[surface] += 1
        return False
    start = time.perf_counter()
    try:
        with _deadline(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except _Timeout:
        FAILURES.append(f"{key}: no answer within {TIME_LIMIT_S}s")
        OUTCOMES[f"{surface}:hang"] += 1
        return False
    except GhoflError as exc:
        if not _is_sentence(str(exc)):
            FAILURES.append(f"{key}: message is not a sentence: {str(exc)[:200]!r}")
        OUTCOMES[f"{surface}:rejected:{type(exc).__name__}"] += 1
        return True
    except Exception as exc:
        FAILURES.append(f"{key}: {type(exc).__name__}: {str(exc)[:300]}")
        OUTCOMES[f"{surface}:crash:{type(exc).__name__}"] += 1
        return False
    if accept:
        OUTCOMES[f"{surface}:accepted-valid"] += 1
    else:
        FAILURES.append(f"{key}: accepted silently ({time.perf_counter() - start:.2f}s)")
        OUTCOMES[f"{surface}:accepted-silently"] += 1
    return False


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return Corpus(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    OUTCOMES.clear()
    FAILURES.clear()
    start = time.perf_counter()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    total = sum(OUTCOMES.values())
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused = sum(v for k, v in OUTCOMES.items() if ":rejected:" in k)
    lines = [f"fuzz: {total} cases ({refused} refused with a ghofl error) in "
             f"{time.perf_counter() - start:.1f}s, "
             f"peak RSS growth {(rss1 - rss0) / 1024:.0f} MiB, {len(FAILURES)} failures"]
    lines += [f"  {k}: {v}" for k, v in sorted(OUTCOMES.items())]
    lines += [f"  (not counted: {v} {k} mutations that left the input unchanged)"
              for k, v in sorted(SKIPPED.items())]
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        print("\n" + "\n".join(lines))


def _same_file_content(a: bytes, b: bytes) -> bool:
    """Same bytes, or the same header JSON and data (a no-op re-serialisation)."""
    if a == b:
        return True
    try:
        return _split(a) == _split(b)
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes of mutated files need no durability (fsync dominates the run time)."""
    import ghofl.stats.codec as codec

    monkeypatch.setattr(codec.os, "fsync", lambda fd: None)


def _write(path: Path, raw: bytes) -> Path:
    path.write_bytes(raw)
    return path


# ---------------------------------------------------------------------- surfaces
N_BYTES = 1500  # per (seed file) for the payload reader: 4 files -> 6,000
N_DATA = 500    # semantic data edits per mode -> 1,500
N_MERGE = 400
N_STORE = 300
N_HEAD = 200    # per head file and mutation family -> 4 × 200 × 2 = 1,600


def test_payload_reader(corpus: Corpus, tmp_path: Path) -> None:
    rng = np.random.default_rng(1234)
    target = tmp_path / "p.ghs"
    for name, raw in corpus.raw.items():
        for i in range(N_BYTES):
            mut = BYTE_MUTATIONS[i % len(BYTE_MUTATIONS)]
            bad = _write(target, mut(rng, raw)).read_bytes()
            run_case("payload", f"{name}/{mut.__name__}/{i}", lambda: load_stats(target),
                     noop=_same_file_content(bad, raw))
    for mode, base in corpus.stats.items():
        for i in range(N_DATA):
            t, what = data_edit_stats(rng, base)
            header, _ = _split(corpus.raw[mode])
            write_safetensors(target, t, header["__metadata__"])
            run_case("payload", f"{mode}/data/{what}/{i}", lambda: load_stats(target),
                     accept=may_stay_valid(what))
    # non-regular files: a FIFO, a directory, a missing file
    fifo = tmp_path / "fifo.ghs"
    os.mkfifo(fifo)
    for p in (fifo, tmp_path, tmp_path / "missing.ghs"):
        run_case("payload", f"special/{p.name}", lambda p=p: load_stats(p))
    # a sparse file with unreferenced data after the last tensor (no allocation of it)
    sparse = tmp_path / "sparse.ghs"
    sparse.write_bytes(corpus.raw["full"])
    with sparse.open("r+b") as f:
        f.truncate(len(corpus.raw["full"]) + (9 << 30))
    run_case("payload", "special/sparse", lambda: load_stats(sparse))
    sparse.unlink()


def _mismatched(rng: np.random.Generator, base: ClientStats) -> ClientStats:
    kind = int(rng.integers(0, 5))
    x, y = gaussian_mixture(int(rng.integers(0, 1000)), num_classes=C, dim=D, n=40)
    if kind == 0:
        return compute_stats(x, y, C, mode="full", encoder=EncoderInfo("other", D))
    if kind == 1:
        x2, _ = gaussian_mixture(5, num_classes=C, dim=D + 2, n=40)
        return compute_stats(x2, y, C, mode="full", projection=ProjectionSpec(3, D + 2, D))
    if kind == 2:
        return compute_stats(x, y, C, mode="full", clip_norm=float(rng.choice([1.0, 7.5])))
    if kind == 3:
        return compute_stats(x, y, ("a", "b", "c"), mode="full")
    return compute_stats(x, y, C, mode="pooled")


def _huge(rng: np.random.Generator, base: ClientStats) -> ClientStats:
    """Valid statistics so large (largest second moment 1e308) that adding two overflows."""
    s = base.arrays()
    factor = float(np.sqrt(float(rng.uniform(0.9e308, 1.7e308))
                           / float(np.abs(s["class_scatter"]).max())))
    return ClientStats(base.meta, counts=np.array(s["counts"]),
                       sums=np.array(s["sums"]) * factor,
                       class_scatter=np.array(s["class_scatter"]) * factor * factor)


def test_merger(corpus: Corpus) -> None:
    rng = np.random.default_rng(99)
    base = corpus.stats["full"]
    for i in range(N_MERGE):
        other = _mismatched(rng, base)
        run_case("merge", f"mismatch/{i}", lambda other=other: sum_stats([base, other]))
    count_max = ClientStats(base.meta, counts=np.full(C, 2**61, dtype=np.int64),
                            sums=np.zeros((C, D)), class_scatter=np.zeros((C, D, D)))
    for i in range(N_MERGE // 4):
        run_case("merge", f"count-overflow/{i}",
                 lambda: sum_stats([count_max, count_max]))
        try:
            big = _huge(rng, base)
        except GhoflError:
            OUTCOMES["merge:huge-refused-on-build"] += 1
            continue
        run_case("merge", f"float-overflow/{i}", lambda big=big: sum_stats([big, big]))


def test_store(corpus: Corpus, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    db = tmp_path / "store.db"
    with AggregationStore(db) as store:
        store.add("seed", corpus.stats["full"])
        before = (store.total(), [c.sha256 for c in store.contributions()])
        target = tmp_path / "c.ghs"
        for i in range(N_STORE):
            kind = i % 3
            if kind == 0:
                _write(target, BYTE_MUTATIONS[i % len(BYTE_MUTATIONS)](rng, corpus.raw["full"]))
                fn: Callable[[], object] = lambda i=i: store.add(f"c{i}", load_stats(target))  # noqa: E731
            elif kind == 1:
                other = _mismatched(rng, corpus.stats["full"])
                fn = lambda i=i, other=other: store.add(f"c{i}", other)  # noqa: E731
            accept = False
            if kind == 2:
                t, what = data_edit_stats(rng, corpus.stats["full"])
                accept = may_stay_valid(what)
                header, _ = _split(corpus.raw["full"])
                write_safetensors(target, t, header["__metadata__"])
                fn = lambda i=i: store.add(f"c{i}", load_stats(target))  # noqa: E731
            refused = run_case("store", f"{kind}/{i}", fn, accept=accept)
            now = (store.total(), [c.sha256 for c in store.contributions()])
            if refused and not (now[0].allclose(before[0], rtol=0.0) and now[1] == before[1]):
                FAILURES.append(f"store:{kind}/{i}: the store changed after a refused add")
            before = now
        big = _huge(rng, corpus.stats["full"])
        store.add("big", big)
        before = (store.total(), [c.sha256 for c in store.contributions()])
        for i in range(20):
            other = _huge(np.random.default_rng(i), corpus.stats["full"])
            run_case("store", f"overflow/{i}", lambda i=i, o=other: store.add(f"big{i}", o))
        now = (store.total(), [c.sha256 for c in store.contributions()])
        assert now[0].allclose(before[0], rtol=0.0) and now[1] == before[1]


def test_model_reader(corpus: Corpus, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    model = tmp_path / "model"
    shutil.copytree(corpus.model, model)
    for name, raw in corpus.heads.items():
        target = model / f"{name}.ghh"
        for i in range(N_HEAD):
            mut = BYTE_MUTATIONS[i % len(BYTE_MUTATIONS)]
            bad = _write(target, mut(rng, raw)).read_bytes()
            run_case("model", f"{name}/{mut.__name__}/{i}", lambda t=target: load_head(t),
                     noop=_same_file_content(bad, raw))
        for i in range(N_HEAD):
            arrays, meta = data_edit_head(rng, raw)
            write_safetensors(target, arrays, meta)
            run_case("model", f"{name}/data/{i}", lambda: load_model(model))
        target.write_bytes(raw)
    manifest = json.loads(corpus.manifest)
    edits: list[Any] = [
        [1, 2], "x", {**manifest, "format_version": "1"}, {**manifest, "format_version": 1.5},
        {**manifest, "heads": []}, {**manifest, "stats": None},
        {**manifest, "stats": {**manifest["stats"], "classes": ["p", "q", "r"]}},
        {**manifest, "stats": {**manifest["stats"], "dim": 7}},
        {**manifest, "heads": {"nb": {"file": "../x.ghh"}}},
        {**manifest, "heads": {"nb": {"file": "lda.ghh"}, "x": 3}},
    ]
    for i, edit in enumerate(edits * 20):
        (model / MANIFEST).write_text(json.dumps(edit))
        run_case("model", f"manifest/{i}", lambda: load_model(model))
    for depth in (100, 10_000, 200_000):
        (model / MANIFEST).write_text("[" * depth + "]" * depth)
        run_case("model", f"manifest/deep{depth}", lambda: load_model(model))
    (model / MANIFEST).unlink()
    os.mkfifo(model / MANIFEST)
    run_case("model", "manifest/fifo", lambda: load_model(model))


def _resign(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with its digest recomputed (what an editor who knows the format does)."""
    from ghofl.model.directory import manifest_digest

    return {**manifest, "digest": manifest_digest(manifest)}


def test_manifest_repointing_and_resigned_edits(corpus: Corpus, tmp_path: Path) -> None:
    """A manifest entry pointed at another head's file is refused, signed or re-signed, and
    whatever else the entry records is edited to match; re-signed random edits never crash
    and never load a head under another head's name."""
    from ghofl.model.directory import file_sha256

    model = tmp_path / "model"
    shutil.copytree(corpus.model, model)
    manifest = json.loads(corpus.manifest)
    names = list(manifest["heads"])
    assert len(names) >= 2
    rejected = 0
    for a in names:
        for b in names:
            if a == b:
                continue
            entry = manifest["heads"][a]
            moved = {**entry, "file": f"{b}.ghh"}
            variants = {
                "unsigned": {**manifest, "heads": {**manifest["heads"], a: moved}},
                "resigned": _resign({**manifest, "heads": {**manifest["heads"], a: moved}}),
                "resigned+sha": _resign({**manifest, "heads": {**manifest["heads"], a: {
                    **moved, "sha256": file_sha256(model / f"{b}.ghh")}}}),
                "resigned+sha+type": _resign({**manifest, "heads": {**manifest["heads"], a: {
                    **moved, "sha256": file_sha256(model / f"{b}.ghh"), "head": b}}}),
            }
            for how, edit in variants.items():
                (model / MANIFEST).write_text(json.dumps(edit))
                rejected += run_case("model", f"repoint/{a}->{b}/{how}",
                                     lambda: load_model(model))
    assert rejected == 4 * len(names) * (len(names) - 1), FAILURES[-3:]
    rng = np.random.default_rng(11)
    for i in range(60):  # re-signed random edits of one entry field
        edit = json.loads(corpus.manifest)
        a, b = rng.choice(names, size=2, replace=False)
        key = str(rng.choice(["file", "head", "sha256"]))
        edit["heads"][a][key] = edit["heads"][b][key] if rng.random() < 0.7 else "x"
        (model / MANIFEST).write_text(json.dumps(_resign(edit)))

        def load_checked() -> None:
            heads, _ = load_model(model)
            assert all(h.name == n for n, h in heads.items()), "a head under another's name"

        run_case("model", f"resigned/{i}", load_checked, accept=True)
    (model / MANIFEST).write_text(corpus.manifest)
    heads, _ = load_model(model)  # the untouched manifest still loads
    assert sorted(heads) == sorted(names)


def _cli(args: list[str]) -> tuple[int, str]:
    from ghofl.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(args)
    return rc, err.getvalue()


def test_cli_one_line_errors(corpus: Corpus, tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    payload = tmp_path / "bad.ghs"
    good = tmp_path / "good.ghs"
    good.write_bytes(corpus.raw["full"])
    model = tmp_path / "model"
    shutil.copytree(corpus.model, model)

    def check(args: list[str]) -> None:
        rc, err = _cli(args)
        lines = [ln for ln in err.splitlines() if not ln.startswith("ghofl: warning:")]
        if rc != 2 or len(lines) != 1 or not lines[0].startswith("ghofl: error: "):
            raise AssertionError(f"rc={rc}, stderr={err[-400:]!r}")
        raise _CliRefused(lines[0])

    for i in range(240):
        kind = i % 3
        mut = BYTE_MUTATIONS[i % len(BYTE_MUTATIONS)]
        if kind == 0:
            raw = corpus.raw["full"]
            bad = _write(payload, mut(rng, raw)).read_bytes()
            args = ["aggregate", str(good), str(payload), "--out", str(tmp_path / "t.ghs")]
        elif kind == 1:
            raw = corpus.raw["pooled"]
            bad = _write(payload, mut(rng, raw)).read_bytes()
            args = ["fit", str(payload), "--out", str(tmp_path / "m"), "--heads", "nb,lda"]
        else:
            name = str(rng.choice(sorted(corpus.heads)))
            raw = corpus.heads[name]
            bad = _write(model / f"{name}.ghh", mut(rng, raw)).read_bytes()
            args = ["evaluate", str(model), "--embeddings", str(corpus.root / "test.npz")]
        run_case("cli", f"{args[0]}/{mut.__name__}/{i}", lambda args=args: check(args),
                 noop=_same_file_content(bad, raw))
        if kind == 2:
            shutil.rmtree(model)
            shutil.copytree(corpus.model, model)


class _CliRefused(GhoflError):
    """The CLI printed one error line and exited 2 (recorded as a rejection)."""


# ---------------------------------------------------------------------- text readers
N_TEXT_TARGETED = 300  # per seed text file (3 files): one planted bad line each
N_TEXT_BYTES = 300     # per seed text file: random byte mutations (may stay valid)
N_TEXT_CLI = 30
TEXT_LABELS = ("neg", "pos", "neu")


def _text_rows(rng: np.random.Generator, fmt: str, n: int) -> list[str]:
    """Valid lines (one record each) with smart quotes, ellipses, U+2028 and NEL inside."""
    extras = ["\u201cq\u201d", "\u2026", "caf\u00e9", "\u2013", "x\u2028y", "a\x85b", "\x0c"]
    rows = []
    for i in range(n):
        words = " ".join(str(w) for w in rng.choice([*extras, "film", "good", "bad"], size=3))
        label = TEXT_LABELS[i % 3]
        if fmt == "lines":
            rows.append(f"{label} {words} {i}")
        elif fmt == "csv":
            rows.append(f'{label},"t {i}","{words}, more"')
        else:
            rows.append(f"{label}\tt {i}\t{words}")
    return rows


def _text_file(rng: np.random.Generator, fmt: str, rows: list[str], header: bool) -> bytes:
    """Encode ``rows`` with blank lines, a random newline style, encoding and BOM."""
    out: list[str] = []
    if header and fmt != "lines":
        out.append(_delim(fmt).join(("label", "title", "description")))
    out += rows
    newline = str(rng.choice(["\n", "\r\n", "\r"]))
    text = newline.join(out) + (newline if rng.random() < 0.7 else "")
    encoding = str(rng.choice(["utf-8", "utf-8-sig", "utf-16", "cp1252"]))
    if encoding == "cp1252":
        text = text.replace("\u2028", " ").replace("\x85", "\u2026")
    return text.encode(encoding)


def _delim(fmt: str) -> str:
    return {"csv": ",", "tsv": "\t"}.get(fmt, " ")


def _plant_bad_row(rng: np.random.Generator, fmt: str) -> tuple[list[str], int, str]:
    """Valid rows with blank lines and one malformed row; its 1-based line number and the
    pattern its error must match."""
    rows = _text_rows(rng, fmt, int(rng.integers(3, 12)))
    for _ in range(int(rng.integers(0, 4))):
        rows.insert(int(rng.integers(0, len(rows) + 1)), str(rng.choice(["", " ", "\t "])))
    # a CSV/TSV file without a header takes its width from its first row: plant after it
    first = 0 if fmt == "lines" else next(i for i, r in enumerate(rows) if r.strip())
    at = int(rng.integers(first + int(fmt != "lines"), len(rows) + 1))
    if fmt == "lines":
        bad, pattern = "lonely", "holds the label 'lonely' but no text"
    else:
        bad, pattern = _delim(fmt).join(["pos", "a", "b", "c"]), "expected 3 .* fields"
    rows.insert(at, bad)
    return rows, at + 1, pattern


def _check_text(path: Path, fmt: str) -> None:
    from ghofl.data.text import read_text_dataset

    ds = read_text_dataset(path, format=fmt)
    assert len(ds.texts) == ds.labels.size > 0 and ds.blank_lines >= 0
    assert all(t.strip() for t in ds.texts)
    assert int(ds.labels.max()) < len(ds.classes)
    if fmt != "csv":  # only CSV quoting may carry a line break inside a text
        assert not any("\n" in t or "\r" in t for t in ds.texts)


def test_text_readers(tmp_path: Path) -> None:
    from ghofl.data.text import read_text_dataset

    rng = np.random.default_rng(2024)
    for fmt in ("lines", "csv", "tsv"):
        path = tmp_path / f"data.{ {'lines': 'txt'}.get(fmt, fmt) }"
        for i in range(N_TEXT_TARGETED):
            rows, line, pattern = _plant_bad_row(rng, fmt)
            header = fmt != "lines" and rng.random() < 0.5
            path.write_bytes(_text_file(rng, fmt, rows, header))
            line += int(header)

            def planted(line: int = line, pattern: str = pattern, path: Path = path,
                        fmt: str = fmt) -> None:
                try:
                    read_text_dataset(path, format=fmt)
                except GhoflError as exc:
                    if not re.search(rf"^line {line} of .*{pattern}", str(exc)):
                        raise AssertionError(f"expected line {line}: {exc}") from None
                    raise

            run_case("text", f"{fmt}/planted/{i}", planted)
        base = _text_file(rng, fmt, _text_rows(rng, fmt, 12), fmt != "lines")
        for i in range(N_TEXT_BYTES):
            mut = TEXT_MUTATIONS[i % len(TEXT_MUTATIONS)]
            bad = mut(rng, base)
            path.write_bytes(bad)
            run_case("text", f"{fmt}/{mut.__name__}/{i}",
                     lambda path=path, fmt=fmt: _check_text(path, fmt),
                     accept=True, noop=bad == base)


def _insert(rng: np.random.Generator, raw: bytes) -> bytes:
    pos = int(rng.integers(0, len(raw) + 1))
    junk = [b"\x00", b"\x85", b"\r", b"\n\n", b"\xff\xfe", b"\xef\xbb\xbf", b'"', b"\t",
            b",", b"\x81", b"\xc3", b"\xe2\x80\xa8"]
    return raw[:pos] + junk[int(rng.integers(0, len(junk)))] + raw[pos:]


def _bom_swap(rng: np.random.Generator, raw: bytes) -> bytes:
    boms = [b"", b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\xff\xfe\x00\x00"]
    return boms[int(rng.integers(0, len(boms)))] + raw


TEXT_MUTATIONS: list[Mutation] = [truncate, bit_flip, append_junk, _insert, _bom_swap]


def test_text_cli_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ghofl embed`` and ``client-stats --data`` on malformed text: one line, exit 2."""
    from ghofl.client.encoders import CallableEncoder

    encoder = CallableEncoder(lambda b: np.ones((len(b), 2)), "ones", 2)
    monkeypatch.setattr("ghofl.client.encoders.get_encoder", lambda *a, **k: encoder)
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(7)
    path = tmp_path / "site.txt"

    def check(args: list[str]) -> None:
        rc, err = _cli(args)
        lines = [ln for ln in err.splitlines() if not ln.startswith("ghofl: warning:")]
        if rc != 2 or len(lines) != 1 or not lines[0].startswith("ghofl: error: "):
            raise AssertionError(f"rc={rc}, stderr={err[-400:]!r}")
        raise _CliRefused(lines[0])

    for i in range(N_TEXT_CLI):
        rows, _, _ = _plant_bad_row(rng, "lines")
        path.write_bytes(_text_file(rng, "lines", rows, False))
        if i % 2:
            args = ["embed", "--data", str(path), "--encoder", "minilm", "--out",
                    str(tmp_path / "x.npz")]
        else:
            args = ["client-stats", "--data", str(path), "--encoder", "minilm", "--out",
                    str(tmp_path / "x.ghs")]
        run_case("cli", f"{args[0]}/text/{i}", lambda args=args: check(args))
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "x.ghs").exists()


def test_zz_summary() -> None:
    total = sum(OUTCOMES.values())
    assert not FAILURES, f"{len(FAILURES)} of {total} fuzz cases failed:\n" + "\n".join(
        FAILURES[:40])
    refused = sum(v for k, v in OUTCOMES.items() if ":rejected:" in k)
    assert refused >= MIN_CASES, (
        f"only {refused} of {total} fuzz cases were bad inputs; expected at least {MIN_CASES}")
