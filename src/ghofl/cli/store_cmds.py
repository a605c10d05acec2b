"""``ghofl store show``, ``ghofl store verify`` and ``ghofl forget``.

``show`` lists a store's contributions, ``verify`` checks its integrity (``--repair`` mends
it, ``--expect`` compares its head with one kept elsewhere) and ``forget`` unlearns a
contribution exactly. ``show`` and ``forget`` run the check every command that reads a store
runs first (:func:`ghofl.store.verify.check_store`) and refuse a store that fails it.

Stores are written by ``ghofl aggregate --store DB PAYLOAD...``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from ghofl.cli.app import app
from ghofl.cli.io import table
from ghofl.errors import ConfigError, StoreError
from ghofl.store import AggregationStore
from ghofl.store.records import StoreHead
from ghofl.store.repair import repair_store
from ghofl.store.verify import check_store, inspect_store, refusal

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
    """List the contributions of a store, the sample count of its total and its head digest."""
    with AggregationStore(db, create=False) as store:
        head = check_store(store)
        items = store.contributions()
        meta = store.meta
        total = store.total() if meta is not None else None
        summary: dict[str, Any] = {
            "store": str(db),
            "contributions": len(items),
            "total_samples": 0 if total is None else total.n_samples,
            "total_clipped": 0 if total is None else total.n_clipped,
            "exact_path": store.exact_path,
            "head": head.digest,
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
        f"{summary['total_samples']} samples{how}; {head}"
    )


@store_app.command("verify")
def verify(
    db: Annotated[Path, typer.Argument(help="The store (SQLite file).")],
    repair: Annotated[bool, typer.Option(
        "--repair", help="Rebuild the total from the contributions that pass their digests, "
        "drop (and list) those that fail, in one atomic change; then verify.")] = False,
    expect: Annotated[str | None, typer.Option(
        "--expect", metavar="DIGEST", help="The head digest the store must have (printed by "
        "'aggregate --store' and 'forget', recorded in a model's card): another one means an "
        "older or another copy of the store.")] = None,
) -> None:
    """Check a store's integrity; with --repair, mend it first.

    SQLite's own check, the digest of every contribution, of the settings and of the total, the
    rows against the head and count the settings record, and the total against the exact sum of
    the contributions. Reads only (works on read-only stores) unless --repair; exit status 2
    when anything is wrong or the head differs from --expect.
    """
    if expect is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", expect):
        raise ConfigError(
            f"--expect must be a store head digest of 64 hex digits (as printed by 'ghofl "
            f"aggregate --store' and 'ghofl forget'); got {expect!r:.80}"
        )
    if repair:
        _repair(db)
    with AggregationStore(db, create=False) as store:
        found = inspect_store(store, full=True)
    for problem in found.problems:
        typer.echo(f"store {db}: {problem}")
    if found.problems:
        raise refusal(db, found)
    if expect is not None and expect.lower() != found.head.digest:
        raise StoreError(
            f"store '{db}' has head {found.head.digest} ({found.head.count} contributions), not "
            f"the expected {expect.lower()}: it is an older (rolled-back) or another copy of the "
            "store; find the copy with the expected head, or re-add the contributions missing "
            "since"
        )
    matched = "" if expect is None else "; it is the expected one"
    typer.echo(
        f"store {db}: ok (SQLite integrity check, settings, {found.head.count} contribution "
        f"digests, total digest, total = exact sum of the contributions); {found.head}{matched}"
    )


def _repair(db: Path) -> None:
    """``verify --repair``: mend the store and print what was dropped."""
    report = repair_store(db)
    if not report.changed:
        typer.echo(f"store {db}: nothing to repair")
        return
    for problem in report.problems:
        typer.echo(f"store {db}: found: {problem}")
    n = len(report.dropped)
    typer.echo(f"store {db}: dropped {n} contribution{'' if n == 1 else 's'} that failed "
               f"{'its digest' if n == 1 else 'their digests'}"
               + (f": {', '.join(map(repr, report.dropped))}" if n else ""))
    before = "" if report.recorded is None else \
        f" (it had recorded {report.recorded.count}, head {report.recorded.digest})"
    typer.echo(f"store {db}: repaired: total rebuilt from {report.head.count} contributions"
               f"{before}; {report.head}")


@app.command("forget")
def forget(
    store: Annotated[Path, typer.Option("--store", help="The store (SQLite file).")],
    client: Annotated[str, typer.Option(
        "--client", help="Client id whose contribution to remove.")],
) -> None:
    """Remove one client's contribution from a store's total, exactly (unlearning)."""
    with AggregationStore(store, create=False) as db:
        check_store(db)
        gone = db.remove(client)
        total = db.total()
        head: StoreHead = db.head
    typer.echo(
        f"forgot {gone.client_id!r}: n={gone.n_samples} samples, SHA-256 {gone.sha256[:12]}…, "
        f"added {gone.added_at}; store {store} now holds {head.count} contributions, total "
        f"n={total.n_samples} samples; {head}"
    )
