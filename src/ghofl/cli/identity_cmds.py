"""``ghofl keys new``, ``ghofl roster build`` and ``ghofl roster show``.

``keys new`` makes a client's long-term identity key; the roster is the federation's list of
identity public keys, fixed out of band.

The operator collects every client's ``.pub`` file, builds the roster once and gives the same
roster file to every client and to the server; clients then refuse any round whose relayed
keys are not signed by the identities the roster lists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ghofl.cli.app import app
from ghofl.cli.io import table
from ghofl.secure.identity import IdentityKey, Roster

keys_app = typer.Typer(name="keys", help="Client identity keys for secure aggregation.",
                       no_args_is_help=True, rich_markup_mode=None)
roster_app = typer.Typer(name="roster",
                         help="The federation's roster of client identity public keys.",
                         no_args_is_help=True, rich_markup_mode=None)
app.add_typer(keys_app, name="keys")
app.add_typer(roster_app, name="roster")


@keys_app.command("new")
def keys_new(
    out: Annotated[Path, typer.Option("--out", help="Private key file to write (mode 0600); "
                                      "the public key goes to OUT.pub.")],
    client_id: Annotated[str, typer.Option("--id", help="This client's id on the roster.")],
) -> None:
    """Make a client's Ed25519 identity key (never overwrites an existing file)."""
    key = IdentityKey.generate()
    public = key.save(out, client_id)
    typer.echo(f"identity key of {client_id!r}: {out} (private, keep it on this client); "
               f"public key: {public}; fingerprint {key.fingerprint()}")


@roster_app.command("build")
def roster_build(
    public_keys: Annotated[list[Path], typer.Argument(help="The clients' .pub files.")],
    out: Annotated[Path, typer.Option("--out", help="Roster file to write (JSON).")],
) -> None:
    """Build the roster from the clients' public key files and print its fingerprint."""
    roster = Roster.from_public_files(public_keys)
    roster.save(out)
    typer.echo(f"roster {out}: {len(roster)} clients, fingerprint "
               f"{roster.fingerprint().hex()}")


@roster_app.command("show")
def roster_show(
    roster_file: Annotated[Path, typer.Argument(help="A roster file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List a roster's clients and print its fingerprint (compare it out of band)."""
    roster = Roster.load(roster_file)
    fingerprint = roster.fingerprint().hex()
    if as_json:
        typer.echo(json.dumps({"fingerprint": fingerprint, "clients": {
            c: k.hex() for c, k in roster.keys.items()}}, indent=2))
        return
    typer.echo(table(("client", "ed25519 public key"),
                     [(c, k.hex()) for c, k in roster.keys.items()]))
    typer.echo(f"roster {roster_file}: {len(roster)} clients, fingerprint {fingerprint}")
