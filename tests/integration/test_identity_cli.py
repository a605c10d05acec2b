"""``ghofl keys new`` and ``ghofl roster build/show`` in process: files, modes, fingerprints,
and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ghofl.cli.main import main
from ghofl.errors import ConfigError
from ghofl.secure.identity import IdentityKey, Roster


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_keys_and_roster_flow(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pubs = []
    for name in ("hospital-a", "hospital-b", "hospital-c"):
        rc, out, err = _run(["keys", "new", "--out", str(tmp_path / f"{name}.key"), "--id", name],
                            capsys)
        assert rc == 0, err
        assert f"identity key of '{name}'" in out
        key_file = tmp_path / f"{name}.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        pubs.append(str(key_file) + ".pub")
    rc, out, err = _run(["roster", "build", *pubs, "--out", str(tmp_path / "roster.json")], capsys)
    assert rc == 0, err
    roster = Roster.load(tmp_path / "roster.json")
    assert roster.clients == ("hospital-a", "hospital-b", "hospital-c")
    assert f"fingerprint {roster.fingerprint().hex()}" in out
    key = IdentityKey.load(tmp_path / "hospital-b.key")
    assert roster.keys["hospital-b"] == key.public
    rc, out, _ = _run(["roster", "show", str(tmp_path / "roster.json"), "--json"], capsys)
    assert rc == 0 and json.loads(out)["fingerprint"] == roster.fingerprint().hex()


def _one_line_error(args: list[str], capsys: pytest.CaptureFixture[str], pattern: str) -> None:
    import re

    rc, _, err = _run(args, capsys)
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and re.search(pattern, lines[0]), err


def test_identity_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "a.key"
    assert _run(["keys", "new", "--out", str(key), "--id", "a"], capsys)[0] == 0
    _one_line_error(["keys", "new", "--out", str(key), "--id", "a"], capsys,
                    r"a.key already exists; an identity key is never overwritten")
    os.chmod(key, 0o644)
    with pytest.raises(ConfigError, match=r"can be read by other users \(mode 644\); run chmod 600"):
        IdentityKey.load(key)
    _one_line_error(["roster", "build", str(key) + ".pub", str(key) + ".pub", "--out",
                     str(tmp_path / "r.json")], capsys, r"client 'a' appears twice")
    (tmp_path / "junk.json").write_text("{}")
    _one_line_error(["roster", "show", str(tmp_path / "junk.json")], capsys,
                    r"junk.json is not a ghofl roster .*build one with `ghofl roster build`")
    _one_line_error(["roster", "build", str(tmp_path / "junk.json"), "--out",
                     str(tmp_path / "r.json")], capsys, r"is not an identity public key file")
    assert not (tmp_path / "r.json").exists()


def test_flower_run_identities_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    pytest.importorskip("flwr")
    np.savez(tmp_path / "test.npz", x=np.zeros((4, 3)), y=np.array([0, 1, 2, 0]))
    ids = tmp_path / "ids"
    for name in ("a", "b"):
        assert _run(["keys", "new", "--out", str(ids / f"{name}.key"), "--id", name], capsys)[0] == 0
    assert _run(["roster", "build", str(ids / "a.key.pub"), str(ids / "b.key.pub"), "--out",
                 str(ids / "roster.json")], capsys)[0] == 0
    base = ["flower-run", "--data-template", str(tmp_path / "p-{partition_id}.npz"), "--out",
            str(tmp_path / "o"), "--test", str(tmp_path / "test.npz"), "--secure", "--clip", "5",
            "--identities", str(ids)]
    plain = [a for a in base if a != "--secure"]
    _one_line_error([*plain, "--nodes", "2", "--plain"], capsys,
                    r"--identities and --insecure-keys apply to --secure only: drop them or "
                    r"add --secure$")
    _one_line_error([*base, "--nodes", "2", "--insecure-keys"], capsys,
                    r"--insecure-keys runs without identities: drop it or --identities$")
    for engine in ("simulation", "deployment"):  # both engines give nodes their identities
        _one_line_error([*base, "--nodes", "3", "--engine", engine], capsys,
                        r"--identities: the roster lists 2 clients but --nodes is 3")
    (ids / "b.key").unlink()
    assert _run(["keys", "new", "--out", str(ids / "b.key"), "--id", "b"], capsys)[0] == 2
    (ids / "b.key.pub").unlink()
    assert _run(["keys", "new", "--out", str(ids / "b.key"), "--id", "b"], capsys)[0] == 0
    _one_line_error([*base, "--nodes", "2", "--engine", "deployment"], capsys,
                    r"--identities: .*b.key is not the key the roster lists for 'b'")
    assert not (tmp_path / "o").exists()
