"""Download one file over HTTP(S) with a progress bar, resume, an MD5 check and an atomic rename.

:func:`download_file` streams ``url`` into ``<dest>.part`` (resuming a partial file with an
HTTP ``Range`` request when the server allows it), checks the MD5 of the complete file, and only
then renames it to ``dest``; a file with the wrong checksum is deleted, never left where a reader
would trust it. Every failure raises :class:`~ghofl.errors.DataError` naming the URL, the
checksum and where to put the file by hand (for machines without internet).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ghofl.errors import DataError

__all__ = ["download_file", "file_md5"]

_CHUNK = 1 << 20
_USER_AGENT = "ghofl-download/1"


def file_md5(path: str | os.PathLike[str], chunk_size: int = _CHUNK) -> str:
    """Hex MD5 of a file, read in chunks of ``chunk_size`` bytes."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk_size), b""):
            h.update(block)
    return h.hexdigest()


def _manual(url: str, md5: str, dest: Path, hint: str) -> str:
    where = hint or f"put it at '{dest}'"
    return f"download {url} yourself (MD5 {md5}) and {where}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (two processes never write one ``.part``)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no locking
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class _Bar:
    """tqdm progress bar on stderr when tqdm is installed, else a line every 10 %."""

    def __init__(self, total: int | None, initial: int, desc: str, enabled: bool) -> None:
        self._bar: Any = None
        self._total, self._done, self._desc = total, initial, desc
        self._next_pct = 10 * (100 * initial // (10 * total)) + 10 if total else 101
        if not enabled:
            self._desc = ""
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True,
                         unit_divisor=1024, mininterval=0.5, file=sys.stderr)

    def update(self, n: int) -> None:
        self._done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._desc and self._total:
            pct = 100 * self._done // self._total
            if pct >= self._next_pct:
                print(f"{self._desc}: {pct}% of {self._total / 1e6:.1f} MB", file=sys.stderr)
                self._next_pct = 10 * (pct // 10) + 10

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _open(url: str, start: int, timeout: float) -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    if start:
        req.add_header("Range", f"bytes={start}-")
    return urllib.request.urlopen(req, timeout=timeout)


def _resume_offset(resp: Any, start: int) -> int:
    """Where the body of ``resp`` starts in the file: ``start`` for a matching 206, else 0."""
    if start and getattr(resp, "status", 200) == 206:
        content_range = resp.headers.get("Content-Range", "")
        if content_range.startswith(f"bytes {start}-"):
            return start
    return 0


def _stream(resp: Any, fh: IO[bytes], bar: _Bar, chunk_size: int) -> int:
    n = 0
    while True:
        block = resp.read(chunk_size)
        if not block:
            return n
        fh.write(block)
        bar.update(len(block))
        n += len(block)


class _RangeRefused(Exception):
    """The server answered 416 to a resume request."""


def _fetch(url: str, part: Path, *, progress: bool, timeout: float, chunk_size: int,
           manual: str, desc: str) -> None:
    """Stream ``url`` into ``part``, appending when ``part`` exists and the server resumes."""
    start = part.stat().st_size if part.exists() else 0
    try:
        resp = _open(url, start, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and start:
            raise _RangeRefused from None
        raise DataError(f"could not download {url} (HTTP {exc.code} {exc.reason}); "
                        f"{manual}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DataError(f"could not download {url} ({reason}); without internet access, "
                        f"{manual}") from None
    with resp:
        offset = _resume_offset(resp, start)
        length = resp.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        bar = _Bar(total, offset, desc, progress)
        try:
            with open(part, "r+b" if offset else "wb") as fh:
                fh.seek(offset)
                fh.truncate()
                got = offset + _stream(resp, fh, bar, chunk_size)
        except (OSError, http.client.HTTPException) as exc:
            have = part.stat().st_size if part.exists() else 0
            raise DataError(f"the download of {url} stopped after {have:,} bytes ({exc!r}); "
                            f"run again to resume it, or {manual}") from None
        finally:
            bar.close()
    if total is not None and got < total:
        raise DataError(f"the download of {url} stopped after {got:,} of {total:,} bytes; "
                        f"run again to resume it, or {manual}")


def download_file(
    url: str,
    dest: str | os.PathLike[str],
    *,
    md5: str,
    progress: bool = True,
    timeout: float = 60.0,
    chunk_size: int = _CHUNK,
    manual_hint: str = "",
    desc: str | None = None,
) -> Path:
    """Download ``url`` to ``dest`` unless a file with MD5 ``md5`` is already there.

    Parameters
    ----------
    url : str
        ``http://``, ``https://`` (or ``file://``) address of the file.
    dest : path
        Final location; its folder is created. The download goes to ``<dest>.part`` first.
    md5 : str
        Expected hex MD5 of the complete file (32 hex digits).
    progress : bool, default True
        Show a progress bar on stderr (tqdm when installed).
    timeout : float, default 60
        Seconds to wait for the server before giving up (per connection and per read).
    chunk_size : int, default 1 MiB
        Bytes read per call.
    manual_hint : str, optional
        How to place the file by hand, used in error messages (default: "put it at DEST").
    desc : str, optional
        Label of the progress bar (default: the file name).

    Returns
    -------
    Path
        ``dest``, holding a file whose MD5 is ``md5``.

    Raises
    ------
    DataError
        No connection (the message names the URL, the MD5 and where to put the file), a
        download cut short (``<dest>.part`` is kept and the next call resumes it), a checksum
        mismatch (the downloaded bytes are deleted), or an existing ``dest`` with another MD5.
    """
    target = Path(dest)
    want = md5.strip().lower()
    if len(want) != 32 or any(ch not in "0123456789abcdef" for ch in want):
        raise DataError(f"md5 must be 32 hex digits; got {md5!r}")
    manual = _manual(url, want, target, manual_hint)
    part = target.with_name(target.name + ".part")
    with _locked(target.with_name(target.name + ".lock")):
        if target.exists():
            got = file_md5(target)
            if got == want:
                return target
            raise DataError(
                f"'{target}' exists but its MD5 is {got}, not {want}: it is damaged or another "
                f"file; delete it and run again, or {manual}"
            )
        try:
            _fetch(url, part, progress=progress, timeout=timeout, chunk_size=chunk_size,
                   manual=manual, desc=desc or target.name)
        except _RangeRefused:  # the partial file does not fit this server's file: start over
            part.unlink(missing_ok=True)
            _fetch(url, part, progress=progress, timeout=timeout, chunk_size=chunk_size,
                   manual=manual, desc=desc or target.name)
        got = file_md5(part)
        if got != want:
            part.unlink(missing_ok=True)
            raise DataError(f"the file downloaded from {url} has MD5 {got}, not {want}, so it "
                            f"was deleted; run again, or {manual}")
        os.replace(part, target)
    return target
