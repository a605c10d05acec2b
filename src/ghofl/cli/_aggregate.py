"""``ghofl aggregate``: input checks, then the plain protocol's server over payload files.

The command runs the one server path (:class:`~ghofl.server.run.FederationServer`): the
payload files answer the plain server's requests through a
:class:`~ghofl.server.files.FilesTransport`, and the server checks every payload and records
it in the store (``--store``), after checking the store (a store whose parts disagree is refused
before anything is added). Every payload added prints the store's new head digest and count,
evidence against a store later rolled back (``ghofl store verify --expect``). This module checks
the inputs before anything is read and words the server's refusals in terms of files.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ghofl.cli._options import AggregationOptions, ServerOptions, cli_plan
from ghofl.cli.io import check_output_dir, read_packed_stats, read_stats, table
from ghofl.errors import (
    AggregationAbortedError,
    ConfigError,
    GhoflError,
    IncompatibleStatsError,
    InputError,
    StatsFormatError,
    StatsValidationError,
    StoreConflictError,
)
from ghofl.moments.estimated import EstimatedStats
from ghofl.server.fields import CLI, FIELDS
from ghofl.server.plan import FederationPlan
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.codec import read_stats_header, save_stats
from ghofl.stats.meta import StatsMeta
from ghofl.store import AggregationStore

if TYPE_CHECKING:
    from ghofl.cli._aggregate_dp import CentralRelease
    from ghofl.server.files import FilesTransport
    from ghofl.server.job import ServerJob
    from ghofl.server.run import FederationServer
    from ghofl.store.records import AddResult

_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """SHA-256 of the bytes of ``path`` (hex), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False


def check_aggregate_inputs(
    files: Sequence[Path], out: Path | None, store: Path | None, client_id: str | None, *,
    model: Path | None = None,
) -> list[str]:
    """Refuse inputs that would lose or double-count data; return every payload's SHA-256.

    Option combinations are checked as well as the payloads.

    Raises
    ------
    ConfigError
        ``--out`` missing without ``--store`` or ``--model``, ``--client-id`` without
        ``--store`` or with several payloads.
    StatsFormatError
        A payload is missing or a directory.
    InputError
        A payload is passed twice (same file or same bytes), or ``--out`` would
        overwrite a payload or the store.
    """
    if store is None and out is None and model is None:
        raise ConfigError("aggregate needs --out FILE (the total to write) or --store DB")
    if client_id is not None and store is None:
        raise ConfigError("--client-id names a payload in a store; use it with --store DB")
    if client_id is not None and len(files) != 1:
        raise ConfigError(
            f"--client-id names one payload but {len(files)} were given; pass one payload per "
            "'ghofl aggregate --client-id' call, or omit --client-id to use the file names"
        )
    for path in files:  # the messages of ghofl.stats.load_stats, before anything is written
        if path.is_dir():
            raise StatsFormatError(f"statistics path '{path}' is a directory; give a file")
        if not path.exists():
            raise StatsFormatError(f"statistics file '{path}' does not exist; check the path")
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the digest forever
            raise StatsFormatError(
                f"statistics path '{path}' is not a regular file (a FIFO, device or socket); "
                "give a file written by ghofl"
            )
    for target, option in ((out, "--out"), (store, FIELDS["aggregation.store"].flag),
                           (model, "--model")):
        if target is None or not target.exists():
            continue
        hit = next((p for p in files if _same_file(p, target)), None)
        if hit is not None:
            raise InputError(
                f"{option} '{target}' is the payload '{hit}': writing it would overwrite an "
                f"input; choose another {option} path"
            )
    if out is not None and store is not None and out.exists() and _same_file(out, store):
        raise InputError(f"--out '{out}' is the store '{store}'; choose another --out path")
    digests: list[str] = []
    for i, path in enumerate(files):
        twin = next((files[j] for j in range(i) if _same_file(files[j], path)), None)
        if twin is not None:
            raise InputError(
                f"payload '{path}' is given twice (also as '{twin}'); it would be counted "
                "twice; pass each payload once"
            )
        read_stats_header(path)  # a payload whose header breaks its schema: refused unread
        sha = file_sha256(path)
        if sha in digests:
            twin = files[digests.index(sha)]
            raise InputError(
                f"payloads '{twin}' and '{path}' hold the same bytes (SHA-256 {sha[:12]}…); the "
                "same statistics would be counted twice; pass each payload once"
            )
        digests.append(sha)
    return digests


def aggregate_files(files: Sequence[Path], digests: Sequence[str], *, out: Path | None,
                    store: Path | None, client_id: str | None,
                    fedcof: FedCOFFit | None = None, dp: CentralRelease | None = None) -> None:
    """Run the server of the plain protocol over the payload files; write or record the total.

    :class:`~ghofl.server.run.FederationServer` runs the plan of the payloads
    (:func:`~ghofl.server.files.payload_plan`, recording each in ``store`` when given) over a
    :class:`~ghofl.server.files.FilesTransport` that reads one file at a time. The round
    stops at the first payload the server refuses. With a store it prints one line per
    payload and a summary, and ``out`` receives the store's total; without, ``out`` receives
    the sum of the files. With ``fedcof`` the server also builds FedCOF's estimate from the
    files' class counts and sums and fits its heads from it (:class:`FedCOFFit`). With ``dp``
    (no store, no FedCOF) the server releases the sum under central differential privacy and
    ``out`` receives the release and its privacy report, never the exact sum
    (:class:`~ghofl.cli._aggregate_dp.CentralRelease`).

    Raises
    ------
    IncompatibleStatsError
        A payload differs from the ones before it (or from the store's) in its metadata.
    StatsValidationError
        The server refused a payload for another reason (e.g. sums that its clipping bound
        cannot produce).
    StoreConflictError
        A payload clashes with the store (another payload under its id, or its bytes under
        another id); the message names the file and how many payloads before it were
        recorded.
    """
    from ghofl.server.files import FilesTransport, payload_plan
    from ghofl.server.run import FederationServer

    ids = [str(p) for p in files]  # distinct: check_aggregate_inputs refused a file given twice
    paths, sha = dict(zip(ids, files, strict=True)), dict(zip(ids, digests, strict=True))

    def store_id(client: str) -> str:
        return client_id if client_id is not None else paths[client].stem

    def on_record(client: str, stats: ClientStats, result: AddResult) -> None:
        cid, path, digest = store_id(client), paths[client], sha[client][:12]
        if result.added:  # the new head: evidence against a rolled-back store, to keep
            typer.echo(f"added {cid!r} from {path}: n={stats.n_samples} samples, "
                       f"SHA-256 {digest}…")
            typer.echo(f"  store {result.head}")
        else:
            typer.echo(f"{cid!r} already present with the same payload ({path}, SHA-256 "
                       f"{digest}…); not counted again")

    # A server that only adds the payloads reads them packed (added packed, unpacked once);
    # a store records, FedCOF and a DP release read each payload whole.
    only_adds = store is None and fedcof is None and dp is None
    transport = FilesTransport(paths, read=read_packed_stats if only_adds else read_stats)
    meta = transport.first_meta()
    plan = payload_plan(meta, store=store)
    plan = plan if fedcof is None else fedcof.plan(plan)
    server = FederationServer(plan if dp is None else dp.plan(plan), ids, meta,
                              store_id=store_id, payload_sha256=sha.get, on_record=on_record)
    transport.halt = lambda: bool(server.half.excluded)
    refusal = _Refusal(paths, store, store_id, transport)
    try:
        aggregated = server.aggregate(transport, noise_rng=None if dp is None else dp.rng())
    except (StoreConflictError, IncompatibleStatsError) as exc:  # from the store
        raise refusal.error(transport.delivered[-1], str(exc), type(exc)) from exc
    except AggregationAbortedError:
        refusal.check(server.half.excluded, meta)
        raise
    refusal.check(server.half.excluded, meta)
    if dp is not None:  # the release only: the exact sum stays in memory
        assert out is not None  # check_aggregate_inputs: --out without --store or --model
        dp.write(aggregated, out, files, digests)
        return
    total = aggregated.report.total  # the exact sum
    if fedcof is not None:
        fedcof.fit(server, aggregated.total, len(files))
    if store is None:
        if out is None:  # with --model only
            return
        size = save_stats(total, out)
        typer.echo(
            f"aggregated {len(files)} files into {out}: n={total.n_samples} samples, "
            f"{total.num_classes} classes, mode {total.mode}, dim {total.dim} ({size} bytes)"
        )
        return
    with AggregationStore(store) as db:
        stored, head = db.total(), db.head
        typer.echo(
            f"store {store}: {head.count} contributions, n={stored.n_samples} samples, "
            f"{stored.num_classes} classes, mode {stored.mode}, dim {stored.dim} "
            f"(exact total: {db.exact_path}); head {head.digest}"
        )
    if out is not None:
        size = save_stats(stored, out)
        typer.echo(f"wrote the store's total to {out} ({size} bytes)")


class _Refusal:
    """The error naming the payload file the server refused, or the store could not record."""

    def __init__(self, paths: dict[str, Path], store: Path | None,
                 store_id: Callable[[str], str], transport: FilesTransport) -> None:
        self.paths, self.store, self.store_id = paths, store, store_id
        self.transport = transport

    def check(self, excluded: Mapping[str, str], meta: StatsMeta) -> None:
        """Raise for the payload the server excluded, if any (the round stopped there)."""
        if not excluded:
            return
        client, reason = next(iter(excluded.items()))
        last = self.transport.last_meta
        diffs = meta.differences(last) if last is not None else []
        if diffs:
            raise self.error(client, (
                "they differ in " + "; ".join(diffs) + "; every payload must come from the "
                "same encoder, projection, class list, clipping bound and upload mode"),
                IncompatibleStatsError)
        raise self.error(client, "the server refused it: it " + reason.removeprefix("input: "),
                         StatsValidationError)

    def error(self, client: str, reason: str, kind: type[GhoflError]) -> GhoflError:
        """``kind`` naming the file of ``client`` (and, with a store, what was recorded)."""
        path = self.paths[client]
        if self.store is None:
            return kind(f"cannot add '{path}' to the total of the files before it: {reason}")
        i = len(self.transport.delivered) - 1
        before = f"; the {i} payload(s) before it were recorded" if i else ""
        return kind(f"cannot record '{path}' as client {self.store_id(client)!r} in store "
                    f"'{self.store}': {reason}{before}")


@dataclass(frozen=True)
class FedCOFFit:
    """``ghofl aggregate --estimate fedcof``: the heads to fit from FedCOF's estimate, and where.

    The estimate is fitted where it is made: its degrees of freedom (the clients per class,
    :class:`~ghofl.moments.estimated.EstimatedStats`) are not in the statistics file format,
    so a total written with ``--out`` is always the exact sum of the files.

    Attributes
    ----------
    job : ServerJob
        The heads and their hyperparameters (``--heads``, ``--param``, ...).
    model : Path
        The model directory to write (``--model``).
    """

    job: ServerJob
    model: Path

    @classmethod
    def of(cls, aggregation: AggregationOptions, server: ServerOptions, model: Path | None,
           store: Path | None) -> FedCOFFit | None:
        """The fit the options ask for (``None``: the plain sum), checked before any file is read.

        Raises
        ------
        ConfigError
            ``--estimate fedcof`` without ``--model`` or with ``--store``, ``--model``
            without ``--estimate fedcof``, or an invalid ``--estimate`` or server option.
        """
        spec = aggregation.spec(**({} if store is None else {"store": str(store)}))
        fedcof = CLI.setting("aggregation.estimate", "fedcof")
        if spec.estimate == "sum":
            if model is not None:
                raise ConfigError(f"--model writes the heads fitted from FedCOF's estimate; "
                                  f"add {fedcof}, or write the sum with --out and fit it with "
                                  "ghofl fit")
            return None
        if model is None:
            raise ConfigError(f"{fedcof} fits the heads from FedCOF's estimate, which no "
                              "statistics file can hold (its degrees of freedom are not in the "
                              "format); give --model DIR for the model directory")
        check_output_dir(model, "--model")
        return cls(server.job(), model)

    def plan(self, plan: FederationPlan) -> FederationPlan:
        """``plan`` (the payloads' plain plan) with FedCOF's estimate and this fit's heads.

        Raises
        ------
        ConfigError
            A rule of the plan is broken (e.g. a head the estimate cannot serve).
        """
        aggregation = replace(plan.aggregation, estimate="fedcof")
        return cli_plan(lambda: FederationPlan(plan.client, aggregation, self.job))

    def fit(self, server: FederationServer, estimate: ClientStats, uploads: int) -> None:
        """Fit the heads from ``estimate`` into :attr:`model`; print what was fitted."""
        lonely = (int((estimate.class_dof == 0).sum())
                  if isinstance(estimate, EstimatedStats) and estimate.class_dof is not None
                  else 0)
        typer.echo(f"FedCOF's estimate from {uploads} uploads: n={estimate.n_samples} samples, "
                   f"{estimate.num_classes} classes, mode {estimate.mode}")
        if lonely:
            typer.echo(f"  {lonely} classes are held by one client only: their covariance "
                       "estimate is 0 (the heads lean on their shrinkage there)")
        result = server.fit(estimate, out_dir=self.model, option="--model")
        typer.echo(table(["head", "fit_seconds", "file"],
                         [[n, t, str(self.model / f"{n}.ghh")]
                          for n, t in result.fit_seconds.items()]))
