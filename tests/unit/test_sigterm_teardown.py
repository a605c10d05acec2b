"""A pytest run stopped with SIGTERM still tears its fixtures down (tests/sigterm_plugin.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_TEST = '''
import time
from pathlib import Path
import pytest

@pytest.fixture
def started(tmp_path_factory):
    out = Path({out!r})
    (out / "started").write_text("yes")
    yield
    (out / "stopped").write_text("yes")

def test_waits(started):
    time.sleep(120)
'''


@pytest.mark.slow
def test_sigterm_stops_the_run_and_tears_fixtures_down(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_wait.py").write_text(_TEST.format(out=str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-p", "tests.sigterm_plugin", "--rootdir", str(tmp_path / "t"),
                             str(tmp_path / "t" / "test_wait.py")],
                            env=env, cwd=tmp_path / "t", stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "pytest did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # exactly the PID this test started
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "stopped").read_text() == "yes"
