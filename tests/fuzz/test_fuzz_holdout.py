"""Seeded fuzzing of statistics files with a held-out section and with float32 sums.

Seed files: every mode with a held-out section (float64), and with a held-out section and
float32 transport. Random byte mutations (the families of ``test_fuzz_readers``) must end in a
:class:`~ghofl.errors.GhoflError` whose message is a sentence; targeted edits of the held-out
section and of the float32 encoding, written with a valid digest, must be refused too.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.errors import GhoflError
from ghofl.stats import ClientStats, compute_stats, load_stats, save_stats
from ghofl.stats.codec import stats_tensors, write_safetensors
from tests.fuzz.test_fuzz_readers import (
    BYTE_MUTATIONS,
    _deadline,
    _is_sentence,
    _same_file_content,
    _split,
)
from tests.helpers import gaussian_mixture

C, D = 3, 4
N_BYTES = 250  # per seed file: 6 files -> 1,500


def _stats(mode: str) -> ClientStats:
    x, y = gaussian_mixture(5, num_classes=C, dim=D, n=80)
    return compute_stats(x, y, C, mode, clip_norm=3.0,  # type: ignore[arg-type]
                         holdout_fraction=0.3)


def _refused(fn: Callable[[], object]) -> str | None:
    """None when ``fn`` raises a GhoflError with a sentence, else what went wrong."""
    try:
        with _deadline(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except GhoflError as exc:
        return None if _is_sentence(str(exc)) else f"not a sentence: {exc}"
    except BaseException as exc:  # a hang or a crash is the finding
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return "accepted"


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes of mutated files need no durability (fsync dominates the run time)."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def test_byte_mutations_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(77)
    failures: list[str] = []
    target = tmp_path / "t.ghs"
    for mode in ("full", "pooled", "gram", "diag"):
        for dtype in ("float64", "float32"):
            seed = tmp_path / f"{mode}-{dtype}.ghs"
            save_stats(_stats(mode), seed, dtype)
            raw = seed.read_bytes()
            assert load_stats(seed).holdout is not None
            for i in range(N_BYTES):
                mut = BYTE_MUTATIONS[i % len(BYTE_MUTATIONS)]
                bad = mut(rng, raw)
                if _same_file_content(bad, raw):  # a no-op re-serialisation: not bad input
                    continue
                target.write_bytes(bad)
                problem = _refused(lambda: load_stats(target))
                if problem is not None:
                    failures.append(f"{mode}/{dtype}/{mut.__name__}/{i}: {problem}")
    assert not failures, "\n".join(failures[:20])


def _edits(s: ClientStats) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """(label, tensors, header changes) of targeted bad files, each with a valid digest."""
    t = stats_tensors(s)
    out: list[tuple[str, dict[str, Any], dict[str, str]]] = []

    def changed(label: str, name: str, fn: Callable[[np.ndarray], np.ndarray],
                header: dict[str, str] | None = None, base: dict[str, Any] | None = None) -> None:
        tensors = dict(t if base is None else base)
        tensors[name] = fn(np.array(tensors[name]))
        out.append((label, tensors, header or {}))

    changed("more held-out than total", "holdout.counts", lambda a: a + 1000)
    changed("held-out sums not a part", "holdout.sums", lambda a: a * 3.0 + 1.0)
    changed("NaN in the held-out section", "holdout.sums", lambda a: a * np.nan)
    changed("negative held-out counts", "holdout.counts", lambda a: a - 1000)
    first_f = next(k for k in t if k.startswith("holdout.") and k != "holdout.counts"
                   and k != "holdout.sums")
    changed("held-out second moments not a part", first_f, lambda a: a * 0.0 - 1.0)
    missing = {k: v for k, v in t.items() if k != "holdout.sums"}
    out.append(("missing held-out array", missing, {}))
    out.append(("held-out clipped beyond total", dict(t), {"holdout_n_clipped": "999"}))
    out.append(("fraction 0 with a section", dict(t),
                {"meta": json.dumps(s.meta.without_holdout().to_dict(), sort_keys=True)}))
    t32 = stats_tensors(s, "float32")
    out.append(("float64 tensor under float32", {**t32, "sums": t["sums"]},
                {"transport_dtype": "float32"}))
    changed("float32 negative variance", "sums", lambda a: a * np.float32(40.0),
            {"transport_dtype": "float32"}, t32)
    return out


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag"])
def test_targeted_edits_are_refused(tmp_path: Path, mode: str) -> None:
    s = _stats(mode)
    seed = tmp_path / "seed.ghs"
    save_stats(s, seed)
    header = _split(seed.read_bytes())[0]["__metadata__"]
    header.pop("content_sha256")
    failures = []
    for label, tensors, changes in _edits(s):
        path = tmp_path / "bad.ghs"
        write_safetensors(path, tensors, {**header, **changes})
        problem = _refused(lambda p=path: load_stats(p))  # type: ignore[misc]
        if problem is not None:
            failures.append(f"{label}: {problem}")
    assert not failures, "\n".join(failures)
