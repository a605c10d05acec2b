"""The upload options of the commands that run a client job are generated from FIELDS (issue 21).

``ghofl client-stats``, ``ghofl simulate`` and ``ghofl flower-run`` declare no upload option by
hand: :func:`ghofl.cli._options.upload_options` gives each one parameter per upload option of
:func:`ghofl.server.fields.upload_fields` (flag, default and help from FIELDS) and hands the
body an :class:`~ghofl.cli._options.UploadOptions` that builds the ClientJob. So a new upload
option is its FieldSpec, its ClientJob field and its use: the last test declares one (a
temporary field) and finds it in every command, from ``--help`` to the ClientJob.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

import click
import numpy as np
import pytest
import typer
import typer.main

from ghofl.cli import _options
from ghofl.cli._options import UploadOptions, upload_options
from ghofl.cli.flower_cmds import flower_run
from ghofl.cli.main import build_command
from ghofl.cli.simulate import simulate
from ghofl.cli.stats_cmds import client_stats
from ghofl.client.job import ClientJob
from ghofl.privacy import DEFAULT_MIN_CLASS_COUNT
from ghofl.server.fields import FIELDS, CliOption, FieldSpec, upload_fields

COMMANDS: dict[str, Callable[..., Any]] = {
    "client-stats": client_stats, "simulate": simulate, "flower-run": flower_run}
#: The upload options a command does not take (the rest, and any new one, it takes).
NOT_TAKEN = {
    "client-stats": {"client.min_class_count"},
    "simulate": set(),
    "flower-run": {"client.projection_dim", "client.projection_seed", "client.projection_basis",
                   "client.min_class_count"},
}


def _options_of(command: click.Command) -> dict[str, click.Option]:
    return {opt: p for p in command.params if isinstance(p, click.Option) for opt in p.opts}


def test_the_upload_options_are_the_client_fields_with_a_cli_declaration() -> None:
    paths = [f.path for f in upload_fields()]
    # FIELDS order is the order of the options in each command's --help
    assert paths == ["client.mode", "client.projection_dim", "client.projection_seed",
                     "client.projection_basis", "client.clip_norm", "client.min_class_count",
                     "client.holdout_fraction", "client.holdout_seed", "client.transport_dtype",
                     "client.feature_transform"]
    for spec in upload_fields():
        assert spec.name in {f.name for f in fields(ClientJob)}
        assert spec.flag and spec.cli is not None and spec.cli_help.endswith(".")
    assert f"Default: {DEFAULT_MIN_CLASS_COUNT} with DP" in FIELDS["client.min_class_count"].cli_help


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_client_command_takes_the_generated_upload_options(name: str) -> None:
    command = build_command().commands[name]  # type: ignore[attr-defined]
    options = _options_of(command)
    for spec in upload_fields():
        if spec.path in NOT_TAKEN[name]:
            assert spec.flag not in options, (name, spec.flag)
            continue
        assert spec.cli is not None
        param = options[spec.flag]
        assert param.help == spec.cli_help, (name, spec.flag)
        assert param.default == spec.cli_default, (name, spec.flag)
        assert param.name == spec.name
    assert set(cast(Any, COMMANDS[name]).upload_exclude) == NOT_TAKEN[name]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_client_command_declares_an_upload_option_by_hand(name: str) -> None:
    body = inspect.signature(COMMANDS[name].__wrapped__, eval_str=True)  # type: ignore[attr-defined]
    flags = {f.flag for f in upload_fields()}
    assert body.parameters["upload"].annotation is UploadOptions
    for param in body.parameters.values():
        declared = [m for m in getattr(param.annotation, "__metadata__", ())
                    if isinstance(m, typer.models.OptionInfo)]
        for info in declared:
            names = (info.default, *(info.param_decls or ()))
            assert not flags & set(names), (name, param.name)


def test_the_decorator_refuses_an_unknown_exclusion_and_a_body_without_upload() -> None:
    with pytest.raises(ValueError, match="not upload options"):
        upload_options(exclude=("client.nope",))
    with pytest.raises(TypeError, match="declares no parameter 'upload"):
        upload_options()(lambda x: x)


# ------------------------------------------------------------ a new upload option, end to end
@dataclass(frozen=True)
class _KnobJob(ClientJob):
    """A ClientJob with one more field, as a new upload option adds."""

    knob: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.knob < 0:
            from ghofl.errors import FieldError

            knob = self.knob
            raise FieldError("client.knob", lambda n: (
                f"{n.name('client.knob')} must be >= 0; got {knob}"))


KNOB = FieldSpec("client.knob", "knob", "--knob", int, 0, "a knob of the test",
                 cli=CliOption("Knob K of the test (every client the same)."))


class _Captured(Exception):
    def __init__(self, job: ClientJob) -> None:
        super().__init__("captured")
        self.job = job


def _regenerated(name: str) -> click.Command:
    """The command built again from FIELDS as they are now (as at import time)."""
    wrapper = cast(Any, COMMANDS[name])
    app = typer.Typer(rich_markup_mode=None)
    app.command(name)(upload_options(exclude=wrapper.upload_exclude)(wrapper.__wrapped__))
    return typer.main.get_command(app)


def test_a_new_upload_option_needs_only_its_field_declaration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ghofl.cli import flower_cmds, stats_cmds
    from ghofl.cli import simulate as simulate_module

    monkeypatch.setitem(cast(dict[str, FieldSpec], FIELDS), KNOB.path, KNOB)
    monkeypatch.setattr(_options, "ClientJob", _KnobJob)

    def capture_job(_emb: Any, job: ClientJob, **_: Any) -> Any:
        raise _Captured(job)

    def capture_plan(plan: Any, *_: Any) -> Any:
        raise _Captured(plan.client)

    monkeypatch.setattr(stats_cmds, "client_statistics", capture_job)
    monkeypatch.setattr(simulate_module, "simulate_plan", capture_plan)
    monkeypatch.setattr(flower_cmds, "_run_config", capture_plan)
    rng = np.random.default_rng(0)
    npz = tmp_path / "e.npz"
    np.savez(npz, x=rng.normal(size=(40, 3)), y=np.arange(40) % 2)
    args = {
        "client-stats": ["--embeddings", str(npz), "--out", str(tmp_path / "o.ghs")],
        "simulate": ["--train", str(npz), "--test", str(npz), "--clients", "2", "--alpha", "1"],
        "flower-run": ["--data-template", "p-{partition_id}.npz", "--out", str(tmp_path / "o"),
                       "--classes", "2"],
    }
    has_flower = importlib.util.find_spec("flwr") is not None
    for name in (n for n in COMMANDS if n != "flower-run" or has_flower):
        command = _regenerated(name)
        knob = _options_of(command)["--knob"]
        assert (knob.help, knob.default, knob.name) == (KNOB.cli.help, 0, "knob")  # type: ignore[union-attr]
        with pytest.raises(_Captured) as got:
            command.main([*args[name], "--knob", "7", "--holdout", "0.25"],
                         standalone_mode=False)
        job = got.value.job
        assert isinstance(job, _KnobJob) and (job.knob, job.holdout_fraction) == (7, 0.25), name
        with pytest.raises(_Captured) as got:
            command.main(args[name], standalone_mode=False)
        assert cast(_KnobJob, got.value.job).knob == 0, name  # not given: the ClientJob default
        # its check runs as the others' do, its error naming the flag
        from ghofl.errors import ConfigError

        with pytest.raises(ConfigError, match=r"^--knob must be >= 0; got -1"):
            command.main([*args[name], "--knob", "-1"], standalone_mode=False)
