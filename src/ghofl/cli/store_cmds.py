"""``ghofl store show``, ``ghofl store verify`` and ``ghofl forget``.

``show`` lists a store's contributions, ``verify`` checks its integrity and ``forget``
unlearns a contribution exactly.

Stores are written by ``ghofl aggregate --store DB PAYLOAD...``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ghofl.cli.app import app
from ghofl.cli.io import table
from ghofl.errors import StoreError
from ghofl.store import AggregationStore
from ghofl.store.verify import verify_store

store_app = typer.Typer(
    name="store",
    help="Inspect an aggregation store (written by 'ghofl aggregate --store').",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(store_app, name="store")


@store_app.command("show")
def show(
    db: Annotated[Path, typer.Argument(help="The store (SQLite file).")],
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print JSON (contributions and total) instead of a table.")] = False,
) -> None:
    """List the contributions of a store and the sample count of its total."""
    with AggregationStore(db, create=False) as store:
        items = store.contributions()
        meta = store.meta
        total = store.total() if meta is not None else None
        summary: dict[str, Any] = {
            "store": str(db),
            "contributions": len(items),
            "total_samples": 0 if total is None else total.n_samples,
            "total_clipped": 0 if total is None else total.n_clipped,
            "exact_path": store.exact_path,
            "meta": None if meta is None else meta.to_dict(),
        }
    if as_json:
        summary["items"] = [
            {"client_id": c.client_id, "sha256": c.sha256, "n_samples": c.n_samples,
             "n_clipped": c.n_clipped, "clip_norm": c.clip_norm, "added_at": c.added_at}
            for c in items
        ]
        typer.echo(json.dumps(summary, indent=2))
        return
    rows = [(c.client_id, c.n_samples, c.n_clipped, c.sha256[:16], c.added_at) for c in items]
    if rows:
        typer.echo(table(("client", "n", "clipped", "sha256", "added (UTC)"), rows))
    how = "" if summary["exact_path"] is None else f"; exact total: {summary['exact_path']}"
    typer.echo(
        f"store {db}: {summary['contributions']} contributions, total n="
        f"{summary['total_samples']} samples{how}"
    )


@store_app.command("verify")
def verify(
    db: Annotated[Path, typer.Argument(help="The store (SQLite file).")],
) -> None:
    """Check a store's integrity.

    SQLite's own check, the digest of every contribution, of the settings and of the total, and the
    total against the exact sum of the contributions. Reads only (works on read-only stores); exit
    status 2 when anything is wrong.
    """
    problems, n = verify_store(db)
    for problem in problems:
        typer.echo(f"store {db}: {problem}")
    if problems:
        raise StoreError(
            f"store '{db}' failed verification ({len(problems)} problem"
            f"{'s' if len(problems) > 1 else ''}, listed above); restore it from a backup "
            "(a wrong cached total alone is rebuilt from intact contributions when the store "
            "is next opened writable, e.g. by 'ghofl store show')"
        )
    typer.echo(
        f"store {db}: ok (SQLite integrity check, settings, {n} contribution digests, total "
        "digest, total = exact sum of the contributions)"
    )


@app.command("forget")
def forget(
    store: Annotated[Path, typer.Option("--store", help="The store (SQLite file).")],
    client: Annotated[str, typer.Option(
        "--client", help="Client id whose contribution to remove.")],
) -> None:
    """Remove one client's contribution from a store's total, exactly (unlearning)."""
    with AggregationStore(store, create=False) as db:
        gone = db.remove(client)
        total = db.total()
        left = len(db)
    typer.echo(
        f"forgot {gone.client_id!r}: n={gone.n_samples} samples, SHA-256 {gone.sha256[:12]}…, "
        f"added {gone.added_at}; store {store} now holds {left} contributions, total "
        f"n={total.n_samples} samples"
    )
