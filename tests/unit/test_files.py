"""ghofl.files: atomic file, JSON and directory writes are complete or absent."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ghofl.files import atomic_directory, atomic_write, write_json_atomic


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_atomic_write_creates_the_file_with_umask_permissions(
    tmp_path: Path, umask_022: None
) -> None:
    target = tmp_path / "sub" / "f.txt"
    atomic_write(target, lambda tmp: Path(tmp).write_text("hello"))
    assert target.read_text() == "hello"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["f.txt"]


def test_failed_atomic_write_keeps_the_old_file_and_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old")

    def half_then_fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_write_json_atomic_round_trips_and_refuses_unserialisable_values(
    tmp_path: Path,
) -> None:
    target = tmp_path / "r.json"
    write_json_atomic(target, {"a": [1, 2.5, None], "b": "x"})
    assert json.loads(target.read_text()) == {"a": [1, 2.5, None], "b": "x"}
    assert target.read_text().endswith("\n")
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "bad.json", {"a": object()})
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    write_json_atomic(tmp_path / "d.json", {"a": object()}, default=lambda _o: "obj")
    assert json.loads((tmp_path / "d.json").read_text()) == {"a": "obj"}


def test_atomic_directory_creates_and_replaces_whole_directories(
    tmp_path: Path, umask_022: None
) -> None:
    target = tmp_path / "out" / "model"
    with atomic_directory(target) as tmp:
        assert tmp.parent == target.parent and not target.exists()
        (tmp / "a.txt").write_text("1")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    with atomic_directory(target) as tmp:
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in target.parent.iterdir()] == ["model"]


def test_failure_inside_atomic_directory_leaves_the_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with pytest.raises(RuntimeError, match="interrupted"), atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("1")
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
    target.mkdir()
    (target / "keep.txt").write_text("k")
    with pytest.raises(RuntimeError, match="interrupted"), atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("1")
        raise RuntimeError("interrupted")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_old_import_path_is_the_same_helper() -> None:
    from ghofl.stats.codec import atomic_write as codec_atomic_write

    assert codec_atomic_write is atomic_write


def test_keyboard_interrupt_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"

    def interrupted(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, interrupted)
    assert list(tmp_path.iterdir()) == []


def test_a_stale_temporary_of_a_killed_writer_is_removed_by_the_next_write(
    tmp_path: Path,
) -> None:
    target = tmp_path / "f.txt"
    stale = tmp_path / ".f.txt.abc123.tmp"  # what a killed process leaves (nobody locks it)
    stale.write_text("partial")
    os.utime(stale, (1_000_000_000, 1_000_000_000))
    fresh = tmp_path / ".f.txt.def456.tmp"  # killed just now: unlocked, so removed too
    fresh.write_text("partial")
    other = tmp_path / ".g.txt.abc123.tmp"  # another target's temporary
    other.write_text("x")
    os.utime(other, (1_000_000_000, 1_000_000_000))
    atomic_write(target, lambda tmp: Path(tmp).write_text("done"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".g.txt.abc123.tmp", "f.txt"]


def test_a_locked_temporary_is_kept(tmp_path: Path) -> None:
    import fcntl

    target = tmp_path / "f.txt"
    live = tmp_path / ".f.txt.live.tmp"
    live.write_text("writing")
    os.utime(live, (1_000_000_000, 1_000_000_000))  # however old: a live writer holds it
    with live.open("rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        atomic_write(target, lambda tmp: Path(tmp).write_text("done"))
    assert live.exists()

