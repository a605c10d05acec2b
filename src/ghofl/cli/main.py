"""Entry point of the ``ghofl`` command (``ghofl = ghofl.cli.main:main``).

Every expected failure — a :class:`~ghofl.errors.GhoflError`, a file-system error, a numerical
failure, a usage error — prints exactly one line ``ghofl: error: <message>`` on stderr and
exits with status 2; there is never a traceback. ``--debug`` (before the subcommand) or the
environment variable ``GHOFL_DEBUG=1`` re-raises instead, showing the traceback.

Subcommands live in their own modules and register onto :data:`ghofl.cli.app.app`.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sqlite3
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

import click
import typer.main
from numpy.linalg import LinAlgError

from ghofl.errors import GhoflError

#: Command modules imported first, so that ``ghofl --help`` lists the file flow in order.
CORE_COMMAND_MODULES: tuple[str, ...] = (
    "ghofl.cli.stats_cmds",
    "ghofl.cli.model_cmds",
    "ghofl.cli.simulate",
)
#: Modules of this package that define no command.
_NOT_COMMANDS = frozenset({"main", "app", "io"})

# WHERE TO ADD A SUBCOMMAND: write a new public module in src/ghofl/cli/ (e.g. ``run.py`` for
# ``ghofl run --config EXPERIMENT.toml --out DIR``) holding one function decorated with
# ``@app.command("run")`` (``from ghofl.cli.app import app``). Every public module of this
# package (name not starting with "_", not in _NOT_COMMANDS) is imported by
# ``command_modules()`` below, so nothing else needs editing. Put helpers in "_name.py" files.

EXIT_ERROR = 2
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    GhoflError, OSError, LinAlgError, MemoryError, sqlite3.Error,
)


def command_modules() -> list[str]:
    """The modules that register subcommands.

    The core ones, then every other public module of :mod:`ghofl.cli` in name order.
    """
    import ghofl.cli as package

    found = sorted(
        f"ghofl.cli.{m.name}" for m in pkgutil.iter_modules(package.__path__)
        if not m.name.startswith("_") and m.name not in _NOT_COMMANDS
    )
    return list(CORE_COMMAND_MODULES) + [m for m in found if m not in CORE_COMMAND_MODULES]


def build_command() -> click.Command:
    """Import every command module and return the click command of the application."""
    for module in command_modules():
        importlib.import_module(module)
    from ghofl.cli.app import app

    return typer.main.get_command(app)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ghofl`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("GHOFL_DEBUG", "") not in ("", "0") or "--debug" in args
    command = build_command()
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            result = command.main(args=args, prog_name="ghofl", standalone_mode=False)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            return 0
        except click.UsageError as exc:
            if debug:
                raise
            cmd = exc.ctx.command_path if exc.ctx else "ghofl"
            _error(f"{exc.format_message()} (see '{cmd} --help')")
            return EXIT_ERROR
        except click.ClickException as exc:
            if debug:
                raise
            _error(exc.format_message())
            return EXIT_ERROR
        except click.Abort:
            _error("aborted")
            return 130
        except KeyboardInterrupt:
            _error("interrupted")
            return 130
        except EXPECTED_ERRORS as exc:
            if debug:
                raise
            _error(describe_error(exc))
            return EXIT_ERROR
    return result if isinstance(result, int) else 0


def describe_error(exc: BaseException) -> str:
    """One-line description of an expected error."""
    if isinstance(exc, GhoflError):
        text = str(exc)
    elif isinstance(exc, OSError) and exc.strerror:
        where = f" '{exc.filename}'" if exc.filename is not None else ""
        text = f"{exc.strerror.lower()}:{where}"
    elif isinstance(exc, LinAlgError):
        text = (f"numerical failure ({exc}); the statistics are degenerate, try more samples "
                "or a larger shrinkage")
    elif isinstance(exc, sqlite3.Error):
        text = _describe_sqlite(exc)
    elif isinstance(exc, MemoryError):
        text = ("out of memory: the computation or a file being read needs more memory than is "
                "free; for large statistics use a projection (--projection-dim) or a lower "
                "--mode, and check that the input files are the ones you meant")
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _describe_sqlite(exc: sqlite3.Error) -> str:
    """One line naming the cause of a SQLite failure of an aggregation store and the fix."""
    raw = str(exc)
    low = raw.lower()
    if "full" in low:
        cause = "the disk is full; free space and run the command again"
    elif "readonly" in low or "read-only" in low:
        cause = ("the store is read-only (file, folder or media not writable); make it "
                 "writable, or use a command that only reads it")
    elif "locked" in low or "busy" in low:
        cause = "another process holds the store's lock; wait for it to finish and retry"
    elif any(w in low for w in ("malformed", "not a database", "corrupt", "no such")):
        cause = "the store file is corrupt; restore it from a backup"
    elif "unable to open" in low or "permission" in low:
        cause = "the store file cannot be opened; check its path and permissions"
    else:
        cause = "check the store file and its folder"
    return f"aggregation store failure ({raw}): {cause}"


def _error(message: str) -> None:
    sys.stderr.write(f"ghofl: error: {message}\n")
    sys.stderr.flush()


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    text = " ".join(str(message).split())
    (file or sys.stderr).write(f"ghofl: warning: {text}\n")


if __name__ == "__main__":
    sys.exit(main())
