"""``ghofl simulate``: a whole one-shot federation in one process.

The JSON written by ``--json`` is :meth:`ghofl.server.simulation.SimulationResult.to_dict`::

    {"heads": {"lda": {"accuracy": 0.93, "fit_seconds": 0.01, "predict_seconds": 0.001,
                       "params": {"shrinkage": 0.05, ...}}, ...},
     "clients": 10, "alpha": 0.1, "seed": 0, "mode": "full",
     "projection_dim": null, "projection_seed": null,
     "upload_bytes_per_client": 12345, "n_train": 5000, "n_test": 1000, "num_classes": 10,
     "classes": ["0", ...],
     "stage_seconds": {"partition": ..., "client_stats": ..., "client_stats_max": ...,
                       "aggregate": ..., "fit/lda": ..., "evaluate/lda": ...},
     "client_sizes": [512, ...], "clip_norm": null, "n_clipped": 0,
     "min_class_count": 5, "suppressed": {"classes": 3, "samples": 7},
     "privacy": null | {"epsilon": 1.0, "delta": 1e-05, "dp_mode": "central",
                        "epsilon_spent": 1.0, "delta_spent": 1e-05, "noise_multiplier": 3.73,
                        "sensitivity": {"counts": 1.0, "sums": R, ...},
                        "sigma": {"counts": ..., ...}, "fractions": {...},
                        "postprocessing": ["...", ...],
                        "epsilon_total": 1.9, "delta_total": 1e-05,  # with --federated-eval:
                        "evaluation": {"noise_multiplier": ..., "sigma": {...}, ...}, ...},
     "aggregation": {"protocol": "plain" | "secure", "seconds": ..., "survivors": 10,
                     "survivor_ids": [...], "dropped": {"client-3": "mask"},
                     "excluded": {"client-5": "<stage>: <reason>"}, "notes": [...],
                     "params": {"num_clients": 10, "threshold": 6, "neighbours": 9, ...},
                     "stages": {"advertise": {
                         "server_seconds": ..., "client_seconds_total": ...,
                         "client_seconds_max": ..., "server_sent_bytes": ...,
                         "server_received_bytes": ..., "client_sent_bytes_mean": ...,
                         "client_sent_bytes_max": ..., "client_received_bytes_mean": ...,
                         "client_received_bytes_max": ..., "replies": 10},
                         "share": {...}, "mask": {...}, "unmask": {...}}},
     "federated_evaluation": null | {"eval_fraction": 0.2, "clients": 10, "n": 1000,
                                     "aggregation": "plain sum in process" | "secure ...",
                                     "protocol": {"protocol": "plain" | "secure",
                                                  "survivors": 10, "dropped": {...}, ...},
                                     "heads": {"lda": {"accuracy", "balanced_accuracy",
                                               "macro_f1", "log_loss", "ece",
                                               "client_accuracy_mean",
                                               "client_accuracy_std", "n", "clients"}},
                                     "ood": null | {"calibration": "federated", "threshold",
                                                    "fpr", "n", "held_out_flagged"}},
     "ghofl_version": "0.1.0"}
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from ghofl.cli._options import (
    AggregationOptions,
    EvalFractionOption,
    FederatedEvalOption,
    ServerOptions,
    UploadOptions,
    aggregation_options,
    eval_fraction_of,
    federation,
    field_option,
    server_options,
    upload_options,
)
from ghofl.cli.app import app
from ghofl.cli.io import (
    check_mode,
    check_output_file,
    resolve_classes,
    table,
    write_json,
)
from ghofl.cli.stats_cmds import projection_basis_option
from ghofl.client.local_data import read_npz_encoder_info
from ghofl.data.embeddings import load_embeddings
from ghofl.errors import ConfigError
from ghofl.server.plan import AggregationSpec
from ghofl.server.simulation import Population, SimulationResult
from ghofl.server.simulation import simulate as simulate_plan

# The options of ``ghofl simulate`` that are no plan field (annotated types, as in
# :mod:`ghofl.cli._options`); the plan's options are generated from FIELDS.
_TrainOption = Annotated[Path, typer.Option("--train", help="Training NPZ with x (n, d), y (n,).")]
_TestOption = Annotated[Path, typer.Option("--test", help="Test NPZ with x (m, d), y (m,).")]
_ClientsOption = Annotated[int, typer.Option("--clients", help="Number of clients K.")]
_AlphaOption = Annotated[float, typer.Option(
    "--alpha", help="Dirichlet concentration of the label skew (e.g. 0.1).")]
_ClassesOption = Annotated[str | None, field_option(
    "client.classes", help="Comma-separated class names (default: from the archives).")]
_NumClassesOption = Annotated[int | None, typer.Option(
    "--num-classes", help="Number of classes (default: from the archives).")]
_MinPerClientOption = Annotated[int, typer.Option(
    "--min-per-client", help="Redraw the partition until every client has this many.")]
_JsonOption = Annotated[Path | None, typer.Option(
    "--json", help="Write the full result as JSON here.")]


@app.command("simulate")
@upload_options()
@aggregation_options(exclude=("aggregation.store",))
@server_options()
def simulate(
    train: _TrainOption,
    test: _TestOption,
    clients: _ClientsOption,
    alpha: _AlphaOption,
    classes: _ClassesOption = None,
    num_classes: _NumClassesOption = None,
    min_per_client: _MinPerClientOption = 0,
    *,
    server: ServerOptions,
    aggregation: AggregationOptions,
    upload: UploadOptions,
    json_out: _JsonOption = None,
    federated_eval: FederatedEvalOption = False,
    eval_fraction: EvalFractionOption = None,
) -> None:
    """Simulate a Dirichlet-partitioned one-shot federation and report accuracy per head.

    Every client computes statistics from its own rows only; the clients and the server run
    the plain sum or, with --secure, the secure aggregation protocol; the server fits each
    head from the total and scores it on the test set. With --federated-eval every client also
    scores the heads on its own held-out rows and the sums of these scores go through the same
    protocol (noised and charged to the privacy budget under DP) and are reported. A secure or
    DP run without --clip takes the bound of the shipped encoder --train records, if any: under
    DP its median public norm (dp_clip_norm), else its default bound.
    """
    fraction = eval_fraction_of(federated_eval, eval_fraction)
    m = check_mode(upload["mode"])
    dim, seed_, basis_name = (upload[k] for k in ("projection_dim", "projection_seed",
                                                  "projection_basis"))
    if seed_ is not None and dim is None:
        raise ConfigError("--projection-seed needs --projection-dim; give both or neither")
    server_job = server.job()
    agg = aggregation.spec()
    _check_min_class_count(upload["min_class_count"])
    upload.check(secure=agg.protocol == "secure", skip=("projection_basis",))
    if json_out is not None:
        check_output_file(json_out, "--json")
    tr, te = load_embeddings(train, "--train"), load_embeddings(test, "--test")
    class_names = resolve_classes(classes, num_classes, [tr, te])
    basis = projection_basis_option(basis_name, dim, seed_, read_npz_encoder_info(train)
                                    if basis_name == "default" else None,
                                    upload["feature_transform"])
    if agg.dp is not None and agg.dp.expected_samples is None and agg.dp.fractions is None:
        # the simulated federation's size is public: it steers the auto budget split
        agg = replace(agg, dp=replace(agg.dp, expected_samples=len(tr.y)))
    plan = federation(tuple(class_names), upload, agg, server_job, mode=m,
                      projection_basis=basis, **_encoder_clip(train, upload, agg),
                      hint=lambda exc: _clip_hint(tr.x) if exc.field == "client.clip_norm"
                      else "")
    result = simulate_plan(plan, (tr.x, tr.y), (te.x, te.y),
                           Population(clients, alpha, min_per_client,
                                      eval_fraction=fraction))
    _report(result, json_out)


def _check_min_class_count(min_class_count: int | None) -> None:
    if min_class_count is not None and min_class_count < 1:
        raise ConfigError(f"--min-class-count must be at least 1 (1 keeps every class); got "
                          f"{min_class_count}")


def _report(result: SimulationResult, json_out: Path | None) -> None:
    """Write the result's JSON to --json (when given) and print its summary."""
    if json_out is not None:
        write_json(json_out, result.to_dict())
    typer.echo(
        f"{result.clients} clients, alpha={result.alpha:g}, seed={result.seed}, mode "
        f"{result.mode}, {result.upload_bytes_per_client} bytes uploaded per client"
    )
    _echo_aggregation(result)
    _echo_privacy(result)
    fed = result.federated_evaluation
    if fed is None:
        typer.echo(table(["head", "accuracy", "fit_seconds"],
                         [[n, r.accuracy, r.fit_seconds] for n, r in result.heads.items()]))
        return
    typer.echo(f"federated evaluation: {fed['clients']} clients held out {fed['n']} rows "
               f"(fraction {fed['eval_fraction']:g}), {fed['aggregation']}")
    typer.echo(table(
        ["head", "test_accuracy", "fed_accuracy", "fed_balanced", "fed_macro_f1",
         "fed_log_loss", "fed_ece", "client_acc_mean", "client_acc_std"],
        [[n, r.accuracy, *(fed["heads"][n][k] for k in (
            "accuracy", "balanced_accuracy", "macro_f1", "log_loss", "ece",
            "client_accuracy_mean", "client_accuracy_std"))]
         for n, r in result.heads.items()]))
    ood = fed.get("ood")
    if ood is not None:
        typer.echo(f"OOD threshold {ood['threshold']:.6g} calibrated from the clients' score "
                   f"histograms ({ood['n']} held-out rows, false-positive rate {ood['fpr']}; "
                   f"{100 * ood['held_out_flagged']:.1f} % of them flagged)"
                   if ood["calibration"] == "federated" else
                   f"OOD threshold not calibrated: {ood['reason']}")


def _echo_privacy(result: SimulationResult) -> None:
    sup = result.suppressed
    if sup.get("classes"):
        typer.echo(f"minimum-count rule (k={result.min_class_count}): {sup['classes']} "
                   f"client-class pairs with {sup['samples']} samples withheld")
    p = result.privacy
    if p is None:
        return
    sigma = ", ".join(f"{b}={v:.4g}" for b, v in p["sigma"].items())
    typer.echo(f"differential privacy ({p['dp_mode']}): spent epsilon={p['epsilon_spent']:g}, "
               f"delta={p['delta_spent']:.3g}; noise multiplier {p['noise_multiplier']:.4g}, "
               f"sigma per block: {sigma}")
    for note in p["postprocessing"]:
        typer.echo(f"  post-processing: {note}")
    if "epsilon_total" in p:
        typer.echo(f"  with the federated evaluation release (noise multiplier "
                   f"{p['evaluation']['noise_multiplier']:.4g}): total epsilon="
                   f"{p['epsilon_total']:g}, delta={p['delta_total']:.3g}")


def _encoder_clip(train: Path, upload: UploadOptions, agg: AggregationSpec) -> dict[str, float]:
    """The clipping bound of a secure or DP run without --clip, from --train's encoder.

    ``{"clip_norm": R}`` when --train records a shipped encoder
    (:func:`~ghofl.client.encoders.recommended_clip_norm`: under DP the median public norm),
    stated on stdout; else ``{}`` (the plan then asks for --clip).
    """
    if upload["clip_norm"] is not None or (agg.dp is None and agg.protocol != "secure"):
        return {}
    from ghofl.client.encoders import recommended_clip_norm

    info = read_npz_encoder_info(train)
    found = None if info is None else recommended_clip_norm(
        info, upload["feature_transform"] or "none", dp=agg.dp is not None)
    if found is None:
        return {}
    typer.echo(f"{found[1]}; give --clip to choose another")
    return {"clip_norm": found[0]}


def _clip_hint(x: np.ndarray) -> str:
    """Why --clip has no default here, with the largest norm and a suggested bound."""
    norms = np.linalg.norm(np.asarray(x, dtype=np.float64), axis=1)
    if norms.size == 0:
        return "The training embeddings are empty"
    largest = float(norms.max())
    digits = 1 - math.floor(math.log10(max(largest * 1.05, 1e-300)))
    suggestion = math.ceil(largest * 1.05 * 10**digits) / 10**digits
    return ("--train records no shipped encoder (at a measured resolution and weights), so it "
            "has no default clipping bound: give an R at "
            f"or above the embeddings' norms (the largest in --train is {largest:.4g}), e.g. "
            f"--clip {suggestion:g}")


def _echo_aggregation(result: SimulationResult) -> None:
    agg = result.aggregation
    if result.clip_norm is not None and result.privacy is None:
        typer.echo(f"clipping bound R={result.clip_norm:g}: {result.n_clipped} of "
                   f"{result.n_train} training samples were scaled down")
    lost = len(result.client_sizes) - agg["survivors"]
    if agg["protocol"] == "plain" and not lost and not agg["excluded"]:
        return
    typer.echo(f"{agg['protocol']} aggregation: {agg['survivors']} of {result.clients} clients "
               f"in the sum, {agg['seconds']:.2f} s")
    for client, stage in agg["dropped"].items():
        kept = " (its input is in the sum)" if stage == "unmask" else ""
        why = f": {agg['refused'][client]}" if client in agg.get("refused", {}) else ""
        typer.echo(f"  dropped at {stage}: {client}{kept}{why}")
    for client, reason in agg["excluded"].items():
        typer.echo(f"  excluded {client}: {reason}")
    hier = agg.get("hierarchy")
    if hier is not None:
        regions, kept = hier["regions"], hier["included_regions"]
        names = ", ".join(kept[:8]) + (f" and {len(kept) - 8} more" if len(kept) > 8 else "")
        typer.echo(f"  regions: {len(kept)} of {len(regions)} in the total "
                   f"({hier['included_clients']} clients): {names or 'none'}")
        for name, r in regions.items():
            if r["status"] != "included":
                typer.echo(f"  {name} ({r['clients']} clients) not in the total: {r['reason']}")
    typer.echo(table(
        ["stage", "server_s", "clients_s", "sent_per_client_B", "received_per_client_B"],
        [[s, v["server_seconds"], v["client_seconds_total"], round(v["client_sent_bytes_mean"]),
          round(v["client_received_bytes_mean"])] for s, v in agg["stages"].items()]))
