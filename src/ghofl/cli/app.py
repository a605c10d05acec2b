"""The typer application every subcommand module registers onto.

Adding a subcommand is one decorated function in its own module::

    from ghofl.cli.app import app

    @app.command("run")
    def run(...) -> None:
        ...

in a public module of :mod:`ghofl.cli` (e.g. ``cli/run.py``); :func:`ghofl.cli.main.main` imports
every public module of the package (see ``ghofl.cli.main.command_modules``).
"""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    name="ghofl",
    help="One-shot federated learning from client statistics (the Gaussian-head OFL family).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from ghofl import __version__

        typer.echo(f"ghofl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option(
        "--debug", hidden=True,
        help="Show the full traceback instead of a one-line error (also GHOFL_DEBUG=1).")]
        = False,
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")]
        = False,
) -> None:
    """One-shot federated learning from client statistics (the Gaussian-head OFL family).

    Flow: each client runs `client-stats` on its embeddings; the server runs `aggregate`, then
    `fit`; `evaluate` scores the fitted heads. `simulate` runs the whole federation in-process.
    Errors print one line `ghofl: error: ...` and exit with status 2.
    """
