"""ghofl.files: atomic file, JSON and directory writes are complete or absent."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
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



_KILLED_DIRECTORY_WRITER = """
import sys, time
from pathlib import Path
from ghofl.files import atomic_directory
target, ready = Path(sys.argv[1]), Path(sys.argv[2])
with atomic_directory(target) as tmp:
    (tmp / "a.txt").write_text("half of the new content")
    ready.write_text(str(tmp))
    time.sleep(60)
"""


def _start_killed_writer(target: Path, ready: Path) -> tuple[subprocess.Popen[bytes], Path]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_DIRECTORY_WRITER,
                             str(target), str(ready)], env=env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError("the writer did not start")
        time.sleep(0.02)
    return proc, Path(ready.read_text())


def test_a_live_directory_writer_is_left_alone_and_a_killed_ones_leftovers_removed(
    tmp_path: Path,
) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "a.txt").write_text("old")
    proc, live_tmp = _start_killed_writer(target, tmp_path / "ready")
    try:
        with atomic_directory(target) as tmp:  # a concurrent write: the live temporary stays
            (tmp / "a.txt").write_text("second")
        assert live_tmp.is_dir()
        assert (target / "a.txt").read_text() == "second"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert live_tmp.is_dir()  # what the kill left behind ...
    assert (target / "a.txt").read_text() == "second"  # ... is never read as the target
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("third")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "ready"]
    assert (target / "a.txt").read_text() == "third"


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_replacing_a_directory_leaves_nothing_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool,
) -> None:
    import ghofl.files as files

    if not exchange:
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    target = tmp_path / "model"
    for content in ("one", "two", "three"):
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text(content)
        assert (target / "a.txt").read_text() == content
        assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_previous_directory_left_aside_by_a_kill_mid_swap_is_put_back(
    tmp_path: Path,
) -> None:
    target = tmp_path / "model"
    aside = tmp_path / ".model.1a2b3c4d.old"  # killed between the two renames: no target
    aside.mkdir()
    (aside / "a.txt").write_text("previous")
    with pytest.raises(RuntimeError, match="interrupted"), atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("interrupted")
    assert (target / "a.txt").read_text() == "previous"  # never lost, even by a failed write
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_leftovers_aside_of_a_present_target_are_removed_unless_locked(tmp_path: Path) -> None:
    import fcntl

    target = tmp_path / "model"
    target.mkdir()
    (target / "a.txt").write_text("current")
    stale, live = tmp_path / ".model.00000000.old", tmp_path / ".model.11111111.old"
    stale.mkdir()
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("new")
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.11111111.old", "model"]
    assert (target / "a.txt").read_text() == "new"
