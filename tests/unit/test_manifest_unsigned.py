"""A model manifest stripped of its checks is refused unless the model is declared legacy.

Issue 44: with ``digest`` and every ``sha256`` removed from ``manifest.json``, a head file
fitted with other parameters was accepted without a word. Now every loader refuses a manifest
without its digest or a file's SHA-256 (one line, exit code 2 on the CLI), unless
``--allow-unsigned-model`` / ``allow_unsigned=True`` says it is a legacy model; then an
:class:`UnsignedModelWarning` names what is unchecked.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.errors import GhoflWarning, InputError
from ghofl.heads import make_head
from ghofl.heads.ood import MahalanobisOOD
from ghofl.model.directory import (
    MANIFEST,
    UnsignedModelWarning,
    check_signed,
    load_model,
    load_ood,
    manifest_digest,
    save_model,
)
from ghofl.moments import compute_moments
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture

X, Y = gaussian_mixture(4, num_classes=3, dim=4, n=150)
FIX = r"re-create the model with `ghofl fit`, or, for a legacy model you trust, pass " \
      r"--allow-unsigned-model \(Python: load_model\(\.\.\., allow_unsigned=True\)\)$"


def _model(tmp: Path) -> Path:
    """A model (nb, lda and an OOD score) whose lda.ghh is then swapped for an lda fitted
    with other parameters, as the issue's attacker does."""
    stats = compute_stats(X, Y, ("a", "b", "c"))
    heads = {n: make_head(n).fit_from_stats(stats) for n in ("nb", "lda")}
    ood = MahalanobisOOD().fit_from_moments(compute_moments(stats))
    m = save_model(tmp / "m", heads, stats_meta=stats.meta, ood=ood)
    other = save_model(tmp / "other", {"lda": make_head("lda", shrinkage=0.9)
                                       .fit_from_stats(stats)}, stats_meta=stats.meta)
    (m / "lda.ghh").write_bytes((other / "lda.ghh").read_bytes())
    return m


def _edit(m: Path, *, digest: str = "keep", files: tuple[str, ...] = ()) -> None:
    """Drop the sha256 of ``files`` (``"ood"`` for the OOD entry), then drop (``"drop"``),
    keep stale (``"keep"``) or recompute (``"resign"``) the digest."""
    manifest = json.loads((m / MANIFEST).read_text())
    for name in files:
        entry = manifest["ood"] if name == "ood" else manifest["heads"][name]
        del entry["sha256"]
    if digest == "drop":
        del manifest["digest"]
    elif digest == "resign":
        manifest["digest"] = manifest_digest(manifest)
    (m / MANIFEST).write_text(json.dumps(manifest))


STRIPPED = [
    ({"digest": "drop", "files": ("nb", "lda", "ood")},
     r"lacks its digest and the SHA-256 of nb\.ghh, lda\.ghh, ood\.npz, so the model cannot "
     r"be checked against what was fitted \(a legacy or stripped manifest\); "),
    ({"digest": "drop"}, r"lacks its digest, so the model cannot be checked"),
    ({"digest": "resign", "files": ("lda",)}, r"lacks the SHA-256 of lda\.ghh, so the model "),
    ({"digest": "keep", "files": ("lda",)}, r"lacks the SHA-256 of lda\.ghh, so the model "),
    ({"digest": "resign", "files": ("ood",)}, r"lacks the SHA-256 of ood\.npz, so the model "),
]
IDS = ["everything", "digest-only", "one-sha-resigned", "one-sha-stale", "ood-sha"]


@pytest.mark.parametrize(("edit", "match"), STRIPPED, ids=IDS)
def test_a_stripped_manifest_is_refused_before_any_file_is_read(
    tmp_path: Path, edit: dict[str, Any], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = _model(tmp_path)
    _edit(m, **edit)

    def no_read(path: Any) -> None:
        raise AssertionError(f"{path} was read before the manifest was refused")

    monkeypatch.setattr("ghofl.model.directory.load_head", no_read)
    with pytest.raises(InputError, match=rf"^'.*manifest\.json' {match}.*{FIX}"):
        load_model(m)


def test_allow_unsigned_loads_a_legacy_model_and_names_what_is_unchecked(
    tmp_path: Path
) -> None:
    m = _model(tmp_path)
    _edit(m, digest="drop", files=("nb", "lda", "ood"))
    with pytest.warns(UnsignedModelWarning, match=r"^loading the unsigned model in '.*m' "
                      r"\(--allow-unsigned-model\): the manifest itself \(no digest\) and the "
                      r"bytes of nb\.ghh, lda\.ghh, ood\.npz \(no sha256\) are unchecked; "
                      r"re-create it with `ghofl fit` to restore the checks$"):
        heads, manifest = load_model(m, allow_unsigned=True)
    assert issubclass(UnsignedModelWarning, GhoflWarning)
    assert heads["lda"].get_params()["shrinkage"] == 0.9  # the swapped head: unchecked indeed
    with pytest.raises(InputError, match=r"lacks the SHA-256 of ood\.npz, so its bytes cannot "
                       r"be checked; re-create the model with `ghofl fit`"):
        load_ood(m, manifest)
    assert isinstance(load_ood(m, manifest, allow_unsigned=True), MahalanobisOOD)


def test_allow_unsigned_names_only_what_is_missing_and_keeps_the_other_checks(
    tmp_path: Path
) -> None:
    m = _model(tmp_path)
    _edit(m, digest="resign", files=("nb",))
    with (
        pytest.warns(UnsignedModelWarning, match=r": the bytes of nb\.ghh \(no sha256\) are "
                     r"unchecked;"),
        pytest.raises(InputError, match=r"head file '.*lda\.ghh' is not the one .* was "
                      r"written with \(its SHA-256 differs\)"),
    ):
        load_model(m, allow_unsigned=True)  # lda.ghh still has its sha256: checked
    _edit(m, digest="drop")
    with (
        pytest.warns(UnsignedModelWarning, match=r": the manifest itself \(no digest\) and "
                     r"the bytes of nb\.ghh \(no sha256\) are unchecked;"),
        pytest.raises(InputError, match=r"SHA-256 differs"),
    ):
        load_model(m, allow_unsigned=True)


def test_a_signed_model_loads_without_a_warning(tmp_path: Path) -> None:
    stats = compute_stats(X, Y, ("a", "b", "c"))
    m = save_model(tmp_path / "m", {"nb": make_head("nb").fit_from_stats(stats)},
                   stats_meta=stats.meta)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(load_model(m).heads) == ["nb"]
        assert list(load_model(m, allow_unsigned=True).heads) == ["nb"]


def test_many_unsigned_files_are_named_in_one_line() -> None:
    manifest = {"digest": "0" * 64, "heads": {f"h{i}": {"file": f"h{i}.ghh"} for i in range(6)}}
    with pytest.raises(InputError, match=r"lacks the SHA-256 of h0\.ghh, h1\.ghh, h2\.ghh, "
                       r"3 more files, so the model"):
        check_signed(manifest, Path("m") / MANIFEST)
    check_signed({"digest": "0" * 64, "heads": {"a": {"file": "a.ghh", "sha256": "1"}}},
                 Path("m") / MANIFEST)  # carries every check: no refusal


# ---------------------------------------------------------------------- the CLI
def _cli(args: list[Any]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in args])
    return rc, err.getvalue()


def _commands(m: Path, tmp: Path) -> dict[str, list[Any]]:
    np.savez(tmp / "test.npz", x=X, y=Y)
    return {
        "evaluate": ["evaluate", m, "--embeddings", tmp / "test.npz"],
        "predict": ["predict", m, "--data", tmp / "test.npz", "--out", tmp / "p.csv"],
        "export": ["export", m, "--head", "lda", "--out", tmp / "lda.onnx", "--head-only",
                   "--force"],
    }


@pytest.mark.parametrize("command", ["evaluate", "predict", "export"])
def test_every_command_refuses_a_stripped_manifest_unless_allowed(
    tmp_path: Path, command: str
) -> None:
    if command == "export":
        pytest.importorskip("onnx")
    m = _model(tmp_path)
    _edit(m, digest="drop", files=("nb", "lda", "ood"))
    args = _commands(m, tmp_path)[command]
    rc, err = _cli(args)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("ghofl: error: ")
    assert "lacks its digest and the SHA-256 of nb.ghh, lda.ghh, ood.npz" in err
    assert "--allow-unsigned-model" in err
    rc, err = _cli([*args, "--allow-unsigned-model"])
    assert rc == 0, err
    assert err.startswith("ghofl: warning: loading the unsigned model in ")
    assert "the manifest itself (no digest) and the bytes of nb.ghh, lda.ghh, ood.npz (no " \
           "sha256) are unchecked" in err
    assert err.count("ghofl: warning: loading the unsigned model") == 1  # once per command


def test_the_cli_still_refuses_a_swapped_head_in_a_signed_manifest(tmp_path: Path) -> None:
    m = _model(tmp_path)  # signed, its lda.ghh swapped
    rc, err = _cli([*_commands(m, tmp_path)["evaluate"], "--allow-unsigned-model"])
    assert rc == 2 and "(its SHA-256 differs)" in err and "warning" not in err
