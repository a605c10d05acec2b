"""``ghofl aggregate-eval`` and ``ghofl personalize``; ``evaluate --local`` / ``--report``.

Federated evaluation through files: each client runs ``ghofl evaluate MODEL --embeddings
LOCAL.npz --local --out client.ghe`` (sums of its own held-out rows only,
:mod:`ghofl.evaluation.federated`), the server runs ``ghofl aggregate-eval *.ghe --out
total.ghe`` and ``ghofl evaluate --report total.ghe`` prints accuracy, balanced accuracy,
macro-F1, log-loss, ECE and the mean ± std of client accuracy per head.

Personalisation: ``ghofl personalize MODEL --stats client.ghs --out MODEL_LOCAL`` writes the
client's own model directory (:mod:`ghofl.model.personalize`) from what it already holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ghofl.cli.app import app
from ghofl.cli.io import check_output_dir, check_output_file, read_stats, table, write_json
from ghofl.cli.predict import AllowUnsignedModelOption, PriorPseudocountOption
from ghofl.errors import ConfigError, InputError
from ghofl.evaluation.federated import (
    EvaluationSums,
    load_evaluation,
    local_evaluation,
    report,
    save_evaluation,
)

__all__ = ["print_report", "write_local_evaluation"]

_METRICS = ("accuracy", "balanced_accuracy", "macro_f1", "log_loss", "ece",
            "client_accuracy_mean", "client_accuracy_std")


def write_local_evaluation(model: Any, x: Any, y: Any, *, transform: str | None,
                           out: Path | None, source: str, ood: Any = None) -> None:
    """``ghofl evaluate --local``: this client's evaluation sums, written to ``out``.

    Parameters
    ----------
    model : FittedModel
    x : ndarray, shape (n, d)
        The client's held-out rows, as ``evaluate`` read them.
    y : ndarray of int, shape (n,)
    transform : str or None
        As :meth:`~ghofl.model.directory.FittedModel.evaluate` takes it.
    out : Path or None
        The ``.ghe`` file (required).
    source : str
        The data, as messages name it.
    ood : MahalanobisOOD, optional
        The model's OOD score: the sums also count the rows' scores in its public bins.
    """
    if out is None:
        raise ConfigError("--local writes the client's evaluation sums to a file; give --out "
                          "client.ghe")
    sums = local_evaluation(model, x, y, transform=transform, what=source, ood=ood)
    save_evaluation(out, sums)
    typer.echo(f"wrote {out}: evaluation sums of {len(sums.heads)} head(s) on "
               f"{next(iter(sums.heads.values())).n} held-out rows (no prediction leaves "
               "this client)")


def print_report(path: Path, json_out: Path | None) -> None:
    """``ghofl evaluate --report``: the metrics of a total of evaluation sums."""
    _echo_report(load_evaluation(path), json_out, str(path))


def _echo_report(total: EvaluationSums, json_out: Path | None, source: str) -> None:
    metrics = report(total)
    if json_out is not None:
        write_json(json_out, {"heads": metrics, "clients": total.clients, "bins": total.bins,
                              "evaluation": source})
    typer.echo(f"{total.clients} clients, {next(iter(total.heads.values())).n} held-out rows")
    typer.echo(table(["head", *_METRICS],
                     [[n, *("-" if r[k] is None else r[k] for k in _METRICS)]
                      for n, r in metrics.items()]))


@app.command("aggregate-eval")
def aggregate_eval(
    files: Annotated[list[Path], typer.Argument(
        help="Evaluation files (.ghe) written by `ghofl evaluate --local`.")],
    out: Annotated[Path, typer.Option("--out", help="The total evaluation file to write.")],
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Also write the metrics of the total as JSON here.")] = None,
) -> None:
    """Add clients' evaluation sums into one total and print its metrics per head."""
    check_output_file(out, "--out")
    if json_out is not None:
        check_output_file(json_out, "--json")
    seen: set[Path] = set()
    for f in files:
        key = f.resolve()
        if key in seen:
            raise InputError(f"'{f}' is given twice; each client's evaluation counts once")
        seen.add(key)
    sums = [load_evaluation(f) for f in files]
    try:
        total = sum(sums[1:], sums[0])
    except InputError as exc:
        raise InputError(f"{exc} (adding {', '.join(map(str, files))})") from exc
    save_evaluation(out, total)
    typer.echo(f"wrote {out}: {len(files)} file(s)")
    _echo_report(total, json_out, str(out))


@app.command("personalize")
def personalize(
    model_dir: Annotated[Path, typer.Argument(help="The global model directory.")],
    stats: Annotated[Path, typer.Option(
        "--stats", help="This client's own statistics (.ghs), as it uploaded them.")],
    out: Annotated[Path, typer.Option("--out", help="The personalised model directory.")],
    prior: Annotated[str, typer.Option(
        "--prior", help="'local': the client's class priors (n_c + λ)/Σ(n_k + λ) in place of "
        "the global ones; 'global': keep them.")] = "local",
    moments: Annotated[bool, typer.Option(
        "--moments", help="Also mix the client's class Gaussians with the global ones, weight "
        "n_c/(n_c + κ) (heads nb and qda).")] = False,
    kappa: Annotated[float | None, typer.Option(
        "--kappa", help="κ of the weight n_c/(n_c + κ) with --moments (default 50).")] = None,
    pseudocount: PriorPseudocountOption = None,
    embeddings: Annotated[Path | None, typer.Option(
        "--embeddings", help="This client's own labelled embeddings (.npz from `ghofl embed`): "
        "the linear heads (lda, fedcgs) are fine-tuned on them over the classes it holds, "
        "pulled towards the global head (--tau).")] = None,
    tau: Annotated[float | None, typer.Option(
        "--tau", help="Strength of the pull towards the global head with --embeddings, in "
        "rows (default 100).")] = None,
    allow_unsigned_model: AllowUnsignedModelOption = False,
) -> None:
    """Write this client's own model: the global one with its priors and, optionally, moments.

    Nothing is sent: the client's counts (and with --moments its class sums) come from its own
    statistics file, and with --embeddings its linear heads are fine-tuned on its own rows
    (:mod:`ghofl.model.fine_tune`). The new directory loads, predicts and exports as any
    model; its manifest records under ``personalised`` what was changed and from what.
    """
    from ghofl.model.directory import load_model
    from ghofl.model.fine_tune import DEFAULT_TAU
    from ghofl.model.personalize import (
        DEFAULT_KAPPA,
        PRIOR_PSEUDOCOUNT,
        save_personalized,
    )

    if prior not in ("local", "global"):
        raise ConfigError(f"--prior must be 'local' or 'global'; got {prior!r}")
    if kappa is not None and not moments:
        raise ConfigError("--kappa weighs the client's moments; add --moments or drop --kappa")
    if tau is not None and embeddings is None:
        raise ConfigError("--tau sets the pull of the fine-tuning on the client's embeddings; "
                          "add --embeddings or drop --tau")
    check_output_dir(out)
    model = load_model(model_dir, allow_unsigned=allow_unsigned_model)
    local = read_stats(stats)
    rows = None if embeddings is None else _local_rows(model, model_dir, embeddings)
    _, record = save_personalized(
        out, model, model_dir, local, str(stats), priors=prior == "local", moments=moments,
        kappa=DEFAULT_KAPPA if kappa is None else kappa,
        pseudocount=PRIOR_PSEUDOCOUNT if pseudocount is None else pseudocount,
        fine_tune=rows, tau=DEFAULT_TAU if tau is None else tau)
    typer.echo(table(["head", "personalised"],
                     [[n, ", ".join(parts) or "nothing"] for n, parts in record.heads.items()]))
    for where, why in record.skipped.items():
        typer.echo(f"  {where} kept global: {why}")
    typer.echo(f"wrote {out} from {record.to_dict()['local_samples']} local samples")


def _local_rows(model: Any, model_dir: Path, path: Path) -> tuple[Any, Any, str]:
    """The client's embeddings archive → (rows in the heads' input space, labels, source).

    The archive's encoder fingerprint must be the model's (when both record one); its labels
    are mapped to the model's classes by name; the model's feature transform is applied.
    """
    from ghofl.client.local_data import read_npz_encoder_info
    from ghofl.data.embeddings import align_labels, load_embeddings
    from ghofl.evaluation.predict import check_encoder_fingerprint

    emb = load_embeddings(path, "--embeddings")
    info = read_npz_encoder_info(path)
    recorded = model.head().meta_.encoder
    if info is not None and recorded is not None:
        check_encoder_fingerprint(info, recorded, f"'{model_dir}'")
    y = align_labels(emb.y, emb.classes, model.classes, f"'{path}'")
    return model.features(emb.x), y, str(path)
