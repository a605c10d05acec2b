"""One option table drives the code (issue 43).

Every option of a federation is declared once in :mod:`ghofl.server.fields` (plan field, Python
type, default, config key, flag, help); the library's dataclasses take their defaults from it
(or it reads them from the lower layers' dataclasses), and the run config's reader and writer,
the plan's summary, the docs' table and the CLI parameters of every command that sets plan
fields are generated from it. So a key or a flag is written in no other module, every field
survives the run config, every command shows the table's default and help, and a new option
needs only its declaration (the last test adds one and finds it everywhere).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import json
import tomllib
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import click
import numpy as np
import pytest
import typer
import typer.main

from ghofl.cli._options import aggregation_options, server_options, upload_options
from ghofl.cli.flower_cmds import flower_run
from ghofl.cli.main import build_command
from ghofl.cli.model_cmds import fit
from ghofl.cli.simulate import simulate
from ghofl.cli.stats_cmds import aggregate, client_stats
from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, FieldError
from ghofl.privacy import DEFAULT_MIN_CLASS_COUNT, DPConfig
from ghofl.secure.config import SecAggConfig
from ghofl.server import config as config_module
from ghofl.server.config import plan_from_config, plan_from_values, plan_to_config
from ghofl.server.fields import FIELDS, REQUIRED, CliOption, FieldSpec, key_table
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "ghofl"
APP = ROOT / "examples" / "flower_app" / "pyproject.toml"
CLASSES = ("a", "b")
HAS_FLOWER = importlib.util.find_spec("flwr") is not None


def _default(cls: type, name: str) -> Any:
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return REQUIRED


def _owner(spec: FieldSpec) -> type:
    if spec.part == "client":
        return ClientJob
    if spec.part == "server":
        return ServerJob
    return DPConfig if spec.within == "dp" else AggregationSpec


# ---------------------------------------------------------------------- types and defaults
#: The flags that switch DP on in the front ends that produce the plans below.
DP_FLAGS = ["--clip", "5", "--dp-epsilon", "1"]
DP_KEYS = {"clip_norm": 5.0, "dp_epsilon": 1.0}
N_TRAIN = 40  # rows of _npz: ghofl simulate's default dp_expected_samples


def _produced(tmp_path: Path, flags: list[str], keys: dict[str, Any]
              ) -> dict[str, FederationPlan]:
    """The plan each front end builds from no option but ``flags`` (``keys``): a run config,
    and the commands simulate and flower-run (when flwr is installed), run to their plan."""
    from ghofl.cli import flower_cmds
    from ghofl.cli import simulate as simulate_module

    def capture(plan: Any, *_: Any) -> Any:
        raise _Captured(plan)

    npz = _npz(tmp_path)
    args = {"simulate": ["--train", str(npz), "--test", str(npz), "--clients", "2",
                         "--alpha", "1"],
            "flower-run": ["--data-template", "p-{partition_id}.npz", "--out",
                           str(tmp_path / "o"), "--classes", "2"]}
    plans = {"run config": plan_from_config({"classes": "a,b", **keys})}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simulate_module, "simulate_plan", capture)
        mp.setattr(flower_cmds, "_run_config", capture)
        for name in (n for n in args if n != "flower-run" or HAS_FLOWER):
            with pytest.raises(_Captured) as got:
                build_command().main([name, *args[name], *flags], standalone_mode=False)
            plans[name] = got.value.plan
    return plans


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FederationPlan]:
    return _produced(tmp_path_factory.mktemp("plain"), [], {})


@pytest.fixture(scope="module")
def produced_dp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FederationPlan]:
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    return _produced(tmp_path_factory.mktemp("dp"), DP_FLAGS, DP_KEYS)


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_each_field_has_the_type_and_the_one_default_of_its_dataclass(
        path: str, request: pytest.FixtureRequest) -> None:
    """The table's default is the dataclass's, and the value every front end produces when
    the option is not given: a run config and the commands, run to the plan they build (DP
    fields: with DP switched on, so that they are read from the plan's DPConfig)."""
    spec = FIELDS[path]
    owner = _owner(spec)
    hint = typing.get_type_hints(owner, localns={"DPConfig": DPConfig})[spec.attr]
    default = _default(owner, spec.attr)
    dp = spec.within == "dp" and path != "aggregation.dp_epsilon"
    plans = request.getfixturevalue("produced_dp" if dp else "produced")
    want = {name: spec.default for name in plans}
    if path == "client.classes":
        assert default is REQUIRED and spec.default is REQUIRED and spec.type == hint
        return
    if path == "client.min_class_count":  # derived: ClientJob's without DP, 5 with it
        assert spec.default is None
        assert spec.unset == f"{DEFAULT_MIN_CLASS_COUNT} with DP, else {default}"
        assert spec.type == hint
        want = {name: default for name in plans}
        with_dp = request.getfixturevalue("produced_dp")
        assert {n: spec.value(p) for n, p in with_dp.items()} == \
            {n: DEFAULT_MIN_CLASS_COUNT for n in with_dp}
    elif path == "aggregation.dp_epsilon":  # DPConfig requires it; no DP without it
        assert default is REQUIRED and spec.default is None and spec.type == hint | None
    else:
        assert spec.type == hint
        assert spec.default == default and type(spec.default) is type(default)
    if spec.secure_only and spec.name in {f.name for f in dataclasses.fields(SecAggConfig)}:
        assert spec.default == _default(SecAggConfig, spec.name)  # read from the secure round
    if path == "aggregation.dp_expected_samples":  # simulate: its training set's size
        want["simulate"] = N_TRAIN
    got = {name: spec.value(plan) for name, plan in plans.items()}
    assert got == want
    assert all(type(got[n]) is type(want[n]) for n in got), got
    if spec.key:  # the run config written from the produced plan holds the default
        assert plan_to_config(plans["run config"])[spec.key] == spec.to_config(want["run config"])


def test_the_docs_show_the_real_defaults() -> None:
    rows = {line.split("|")[1].strip(" `"): line for line in key_table().splitlines()[2:]}
    assert set(rows) == set(FIELDS)
    assert '| "plain" |' in rows["aggregation.protocol"]
    assert f"| {SecAggConfig(clip_norm=1.0).limbs} |" in rows["aggregation.limbs"]
    assert '| "nb,lda,qda,fedcgs" |' in rows["server.heads"]
    assert "0: 5 with DP, else 1 |" in rows["client.min_class_count"]


def test_one_default_in_the_library_every_run_config_and_the_app() -> None:
    plan = plan_from_config({"classes": "a,b"})
    assert plan == FederationPlan(ClientJob(CLASSES))  # the library's defaults are the config's
    assert plan.aggregation.protocol == "plain"
    assert plan.server == ServerJob() and ServerJob().heads == FIELDS["server.heads"].default
    app = tomllib.loads(APP.read_text(encoding="utf-8"))["tool"]["flwr"]["app"]["config"]
    for spec in FIELDS.values():
        if spec.key and spec.default is not REQUIRED:
            assert app[spec.key] == spec.to_config(spec.default), spec.key


# ---------------------------------------------------------------------- the run config
SECURE = {"aggregation.protocol": "secure", "client.clip_norm": 2.0}
DP = {"aggregation.dp_epsilon": 2.0, "client.clip_norm": 2.0}
#: A value other than the default for every field with a config key, with what it needs.
SAMPLES: dict[str, tuple[Any, dict[str, Any]]] = {
    "client.classes": (("x", "y", "z"), {}),
    "client.mode": ("pooled", {"server.heads": ("nb", "lda")}),  # QDA needs mode full
    "client.encoder": ("efficientnet-lite0", {}),
    "client.encoder_name": ("mine", {}),
    "client.resolution": (128, {}),
    "client.backend": ("torch", {}),
    "client.projection_dim": (2, {}),
    "client.projection_seed": (9, {"client.projection_dim": 2}),
    "client.projection_basis": ("0123456789abcdef", {"client.projection_dim": 2}),
    "client.clip_norm": (3.0, {}),
    "client.min_class_count": (4, {}),
    "client.holdout_fraction": (0.2, {}),
    "client.holdout_seed": (7, {}),
    "client.transport_dtype": ("float32", {}),
    "client.feature_transform": ("sqrt", {}),
    "aggregation.protocol": ("secure", {"client.clip_norm": 2.0}),
    "aggregation.threshold": (3, SECURE),
    "aggregation.neighbours": (2, SECURE),
    "aggregation.max_samples": (500, SECURE),
    "aggregation.limbs": (1, SECURE),
    "aggregation.corrupt_fraction": (0.2, SECURE),
    "aggregation.dropout_fraction": (0.1, SECURE),
    "aggregation.sigma": (30.0, SECURE),
    "aggregation.eta": (15.0, SECURE),
    "aggregation.regions": (2, SECURE),
    "aggregation.dp_epsilon": (1.5, {"client.clip_norm": 2.0}),
    "aggregation.dp_delta": (1e-6, DP),
    "aggregation.dp_mode": ("distributed", {**DP, **SECURE}),
    "aggregation.dp_split": ("equal", DP),
    "aggregation.dp_expected_samples": (1000, DP),
    "aggregation.dp_subspace": ("none", DP),
    "aggregation.dp_prior": ("none", DP),
    "aggregation.store": ("s.db", {}),
    "aggregation.estimate": ("fedcof", {"client.mode": "means", "server.heads": ("lda",)}),
    "server.heads": (("nb", "lda"), {}),
    "server.head_params": ({"lda": {"shrinkage": 0.25}}, {}),
    "server.seed": (3, {}),
    "server.progress": (True, {}),
    "server.preset": ("paper", {}),
}


def _sample_plan(path: str) -> FederationPlan:
    value, needs = SAMPLES[path]
    return plan_from_values({"client.classes": CLASSES, **needs, path: value})


def _skip_without_privacy(path: str) -> None:
    """Skip a sample with DP (its noise is calibrated when its plan is built) without the
    privacy extra; every other sample runs."""
    needs = SAMPLES[path][1]
    if "aggregation.dp_epsilon" in {path, *needs}:
        pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")


def test_the_samples_cover_every_field_of_the_run_config() -> None:
    assert set(SAMPLES) == {p for p, s in FIELDS.items() if s.key}


@pytest.mark.parametrize("path", sorted(SAMPLES))
def test_every_field_survives_plan_config_plan(path: str) -> None:
    _skip_without_privacy(path)
    spec, value = FIELDS[path], SAMPLES[path][0]
    plan = _sample_plan(path)
    assert spec.value(plan) == value and value != spec.default
    cfg = plan_to_config(plan)
    assert cfg[spec.key] == spec.to_config(value)
    assert set(cfg) == {s.key for s in FIELDS.values() if s.key}
    assert all(isinstance(v, str | int | float | bool) for v in cfg.values())
    assert plan_from_config(cfg) == plan
    assert plan_from_config(json.loads(json.dumps(cfg))) == plan  # a TOML / Flower config


@pytest.mark.parametrize("path", sorted(SAMPLES))
def test_describe_has_every_field(path: str) -> None:
    _skip_without_privacy(path)
    described = _sample_plan(path).describe()
    assert {f"{part}.{name}" for part, names in described.items() for name in names} == set(FIELDS)
    spec, value = FIELDS[path], SAMPLES[path][0]
    assert described[spec.part][spec.name] == json.loads(json.dumps(value))
    json.dumps(described)  # JSON-ready


@pytest.mark.parametrize(("cfg", "match"), [
    ({}, r"^run config: classes is required \(JSON list of class names"),
    ({"classes": "a,b", "dp_delta": 1e-6},
     r"^run config: dp_delta needs dp_epsilon; give the privacy budget epsilon$"),
    ({"classes": "a,b", "dp_epsilon": 1.0, "clip_norm": 1.0, "dp_split": "thirds"},
     r"^run config: dp_split must be one of auto, equal; got 'thirds'$"),
    ({"classes": "a,b", "limbs": 1.5}, r"^run config key 'limbs' must be an integer; got 1\.5$"),
    ({"classes": "a,b", "progress": 1}, r"^run config key 'progress' must be true or false"),
])
def test_bad_run_config_values_are_refused_naming_the_key(cfg: dict[str, Any],
                                                          match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_from_config(cfg)


OLD_KEYS = {"min-class-count": "min_class_count", "max-samples": "max_samples",
            "corrupt-fraction": "corrupt_fraction", "dropout-fraction": "dropout_fraction",
            "exposure-bits": "exposure_bits", "abort-bits": "abort_bits",
            "dp-epsilon": "dp_epsilon", "dp-delta": "dp_delta", "dp-mode": "dp_mode",
            "dp-split": "dp_split", "dp-expected-samples": "dp_expected_samples"}


@pytest.mark.parametrize(("old", "new"), sorted(OLD_KEYS.items()))
def test_an_old_hyphenated_key_is_refused_naming_the_new_one(old: str, new: str) -> None:
    default = plan_to_config(FederationPlan(ClientJob(CLASSES)))[new]  # even at the default
    with pytest.raises(ConfigError, match=rf"^run config key '{old}' is now '{new}'; "
                                          r"rename it$"):
        plan_from_config({"classes": "a,b", old: default})


def test_a_node_refuses_an_old_spelling_of_its_policy_keys() -> None:
    from ghofl.integrations.flower._config import node_policy

    with pytest.raises(ConfigError, match=r"^node config key 'exposure-bits' is now "
                                          r"'exposure_bits'; rename it$"):
        node_policy({"exposure-bits": 30.0}, authenticated=True)


# ---------------------------------------------------------------------- the commands
COMMANDS: dict[str, Callable[..., Any]] = {
    "simulate": simulate, "flower-run": flower_run, "client-stats": client_stats, "fit": fit,
    "aggregate": aggregate}
#: The parts whose generated options each command takes, and the fields of them it does not.
TAKES: dict[str, tuple[set[str], set[str]]] = {
    "simulate": ({"client", "aggregation", "server"}, {"aggregation.store"}),
    "flower-run": ({"client", "aggregation", "server"},
                   {"client.projection_dim", "client.projection_seed",
                    "client.projection_basis", "client.min_class_count", "aggregation.store",
                    "aggregation.drops"}),
    "client-stats": ({"client"}, {"client.min_class_count"}),
    "fit": ({"server"}, set()),
    # aggregate takes --estimate and central DP of the aggregation options (and --store and
    # --min-class-count as its own)
    "aggregate": ({"aggregation", "server"},
                  {p for p in FIELDS if p.startswith("aggregation.")} - {
                      "aggregation.estimate", "aggregation.dp_epsilon", "aggregation.dp_delta",
                      "aggregation.dp_split", "aggregation.dp_expected_samples",
                      "aggregation.dp_subspace", "aggregation.dp_prior"}),
}
#: The fields each command declares itself under the table's flag, with help of its own.
OWN: dict[str, set[str]] = {
    "client-stats": {"client.classes", "client.encoder", "client.encoder_name",
                     "client.resolution", "client.backend"},
    "aggregate": {"aggregation.store", "client.min_class_count"},
}
_CLICK_TYPES = {int: "integer", float: "float", str: "text", bool: "boolean"}


def _options_of(command: click.Command) -> dict[str, click.Option]:
    return {opt: p for p in command.params if isinstance(p, click.Option)
            for opt in (*p.opts, *p.secondary_opts)}


def _own_default(spec: FieldSpec) -> Any:
    """The default of a field a command declares itself: the table's, or not given (None)
    where the table's is none (required, derived or empty)."""
    if spec.default is REQUIRED or spec.default is None or spec.default == "":
        return None
    return spec.to_config(spec.default)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_takes_its_fields_with_the_tables_flag_default_and_help(name: str) -> None:
    options = _options_of(build_command().commands[name])  # type: ignore[attr-defined]
    parts, excluded = TAKES[name]
    own = OWN.get(name, set())
    for spec in FIELDS.values():
        if spec.path in own:
            param = options[spec.flag]
            assert (param.name, param.default) == (spec.name, _own_default(spec)), \
                (name, spec.flag)
            assert param.help and param.help != spec.help, (name, spec.flag)  # its own
            continue
        if spec.cli is None:
            continue
        if spec.part not in parts or spec.path in excluded:
            # absent, or another option of the command under the same flag
            assert spec.flag not in options or options[spec.flag].help != spec.cli_help, \
                (name, spec.flag)
            continue
        param = options[spec.flag]
        assert (param.name, param.help, param.default) == (
            spec.name, spec.cli_help, spec.cli_default), (name, spec.flag)
        if spec.switch:
            assert param.is_flag and param.secondary_opts == [spec.cli.off_flag]
        elif spec.cli.repeat:
            assert param.multiple
        else:
            assert param.type.name == _CLICK_TYPES[spec.scalar], (name, spec.flag)
    if "server" in parts:
        assert options["--heads"].default == ",".join(FIELDS["server.heads"].default)
    if "aggregation" in parts and "aggregation.protocol" not in excluded:
        assert options["--secure"].default is False  # the plain protocol


def test_flower_run_passes_the_dp_options_to_the_server_app(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """flower-run writes its DP options into the run config, which the ServerApp reads through
    plan_from_config; the example app declares every key it sends."""
    if not HAS_FLOWER:
        pytest.skip("flwr is not installed: pip install 'ghofl[flower]'")
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    from ghofl.integrations.flower import runner

    sent: dict[str, Any] = {}

    def run_local(engine: str, nodes: int, cfg: dict[str, Any], *_: Any, **__: Any) -> Any:
        sent.update(cfg)
        raise _Captured(None)

    monkeypatch.setattr(runner, "run_local", run_local)
    npz = _npz(tmp_path)
    with pytest.raises(_Captured):
        build_command().main(["flower-run", "--data-template", str(npz), "--out",
                              str(tmp_path / "o"), "--test", str(npz), "--clip", "5",
                              "--dp-epsilon", "2", "--dp-delta", "1e-6", "--dp-split", "equal",
                              "--dp-expected-samples", "500"], standalone_mode=False)
    plan = plan_from_config(sent)
    assert plan.aggregation.dp == DPConfig(2.0, 1e-6, split="equal", expected_samples=500)
    assert plan.client.min_class_count == DEFAULT_MIN_CLASS_COUNT  # the DP default of k
    app = tomllib.loads(APP.read_text(encoding="utf-8"))["tool"]["flwr"]["app"]["config"]
    assert set(sent) <= set(app)  # Flower refuses keys the app does not declare


# ---------------------------------------------------------------------- a new option
@dataclasses.dataclass(frozen=True)
class _KnobSpec(AggregationSpec):
    """An AggregationSpec with one more field, as a new aggregation option adds."""

    knob: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.knob < 0:
            knob = self.knob
            raise FieldError("aggregation.knob", lambda n: (
                f"{n.name('aggregation.knob')} must be >= 0; got {knob}"))


KNOB = FieldSpec("aggregation.knob", "knob", "--knob", int, 0, "a knob of the test",
                 cli=CliOption("Knob K of the test."))


class _Captured(Exception):
    def __init__(self, plan: Any) -> None:
        super().__init__("captured")
        self.plan = plan


def _npz(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "e.npz"
    np.savez(path, x=rng.normal(size=(40, 3)), y=np.arange(40) % 2)
    return path


def _rebuilt(name: str) -> click.Command:
    """The command built again from FIELDS as they are now (as at import time)."""
    wrapper = cast(Any, COMMANDS[name])
    body = inspect.unwrap(wrapper)
    for param, decorate in (("server", server_options), ("aggregation", aggregation_options)):
        if hasattr(wrapper, f"{param}_exclude"):
            body = decorate(exclude=getattr(wrapper, f"{param}_exclude"),
                            only=getattr(wrapper, f"{param}_only"))(body)
    body = upload_options(exclude=wrapper.upload_exclude)(body)
    app = typer.Typer(rich_markup_mode=None)
    app.command(name)(body)
    return typer.main.get_command(app)


def test_a_new_aggregation_option_needs_only_its_declaration(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Declared in FIELDS (and its dataclass field): the run config reads and writes it, the
    plan describes it, the docs list it, and simulate and flower-run take it as --knob."""
    from ghofl.cli import flower_cmds
    from ghofl.cli import simulate as simulate_module

    monkeypatch.setitem(cast(dict[str, FieldSpec], FIELDS), KNOB.path, KNOB)
    monkeypatch.setattr(config_module, "AggregationSpec", _KnobSpec)
    plan = plan_from_config({"classes": "a,b", "knob": 7})
    assert isinstance(plan.aggregation, _KnobSpec) and plan.aggregation.knob == 7
    cfg = plan_to_config(plan)
    assert cfg["knob"] == 7 and plan_from_config(cfg) == plan
    assert plan.describe()["aggregation"]["knob"] == 7
    assert "| `aggregation.knob` | `knob` | `--knob` | int | 0 | a knob of the test |" \
        in key_table()
    with pytest.raises(ConfigError, match=r"^run config: knob must be >= 0; got -1$"):
        plan_from_config({"classes": "a,b", "knob": -1})

    def capture(plan: Any, *_: Any) -> Any:
        raise _Captured(plan)

    monkeypatch.setattr(simulate_module, "simulate_plan", capture)
    monkeypatch.setattr(flower_cmds, "_run_config", capture)
    npz = _npz(tmp_path)
    args = {"simulate": ["--train", str(npz), "--test", str(npz), "--clients", "2",
                         "--alpha", "1"],
            "flower-run": ["--data-template", "p-{partition_id}.npz", "--out",
                           str(tmp_path / "o"), "--classes", "2"]}
    for name in (n for n in args if n != "flower-run" or HAS_FLOWER):
        command = _rebuilt(name)
        knob = _options_of(command)["--knob"]
        assert (knob.help, knob.default, knob.name) == ("Knob K of the test.", 0, "knob")
        for given, want in ((["--knob", "7"], 7), ([], 0)):
            with pytest.raises(_Captured) as got:
                command.main([*args[name], *given], standalone_mode=False)
            assert got.value.plan.aggregation.knob == want, name
        with pytest.raises(ConfigError, match=r"^--knob must be >= 0; got -1$"):
            command.main([*args[name], "--knob", "-1"], standalone_mode=False)


# ---------------------------------------------------------------------- declared once
#: Modules that hold a plan field's flag as a literal, with the reason: a command's own option
#: under the same flag (another meaning), or a command whose owner has still to generate it
#: (then drop the entry). Stale entries fail the test, so the list only shrinks.
FLAG_LITERALS: dict[str, tuple[set[str], str]] = {
    "cli/embed.py": ({"--backend", "--encoder", "--classes", "--resolution", "--progress"},
                     "ghofl embed embeds data outside any plan (its encoder and progress bar)"),
    "cli/run.py": ({"--progress", "--resolution", "--backend", "--heads"},
                   "ghofl run runs a bench experiment grid, whose config is no plan"),
    "cli/predict.py": ({"--feature-transform", "--backend"},
                       "ghofl predict: the inputs' transform and encoder runtime, no plan"),
    "cli/stats_cmds.py": ({"--progress", "--seed", "--clip"},
                          "client-stats --progress is the encoder's progress bar, feature-map "
                          "--seed draws its anchors, covariance-prior --clip clips the public "
                          "rows (0: the encoder's default bound)"),
    "cli/store_cmds.py": ({"--store"}, "ghofl store: the store file it reads, no plan"),
}
#: Literals equal to a hyphenated spelling of a config key, with the reason.
HYPHEN_LITERALS: dict[str, tuple[set[str], str]] = {
    "cli/stats_cmds.py": ({"projection-basis"}, "the command ghofl projection-basis"),
    "stats/header.py": ({"transport-dtype"}, "the Flower records' key of the statistics "
                                             "header (docs/file-formats.md), no run config"),
}
#: Modules that read a config key of the table from a config of their own, with the reason.
KEY_LITERALS: dict[str, tuple[set[str], str]] = {
    "integrations/flower/fedavg_app.py": ({"seed"}, "the FedAvg baseline app's own run config "
                                                    "(examples/flower_fedavg), no plan"),
}
#: Names of run and node configs in the sources; a key read from or written into one is the
#: table's business (plan_from_config, plan_to_config, FIELDS[...].key).
CONFIG_NAMES = {"cfg", "run_cfg", "node_cfg", "config", "run_config", "context_run_config"}
CFG_READERS = {"cfg_str", "cfg_int", "cfg_float"}


def _literals() -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "server/fields.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out[rel] = [(n.lineno, n.value) for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return out


def _config_keys_accessed(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants read from or written into a config by name (``cfg["key"]``, ...)."""
    def named(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id in CONFIG_NAMES

    def const(node: ast.AST | None) -> list[tuple[int, str]]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [(node.lineno, node.value)]
        return []

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and named(node.value):
            found += const(node.slice)
        elif isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Attribute) and named(fn.value) and node.args:
                found += const(node.args[0]) if fn.attr in ("get", "pop", "setdefault") else []
                if fn.attr == "update" and isinstance(node.args[0], ast.Dict):
                    found += [c for k in node.args[0].keys for c in const(k)]
            elif isinstance(fn, ast.Name) and fn.id in CFG_READERS and len(node.args) > 1:
                found += const(node.args[1])
        elif isinstance(node, ast.Compare) and any(named(c) for c in node.comparators):
            found += const(node.left)
        elif isinstance(node, ast.Assign) and any(named(t) for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            found += [c for k in node.value.keys for c in const(k)]
    return found


def test_no_flag_of_a_plan_field_is_written_outside_the_table() -> None:
    flags = {f.flag for f in FIELDS.values() if f.flag}
    found: dict[str, set[str]] = {}
    for rel, literals in _literals().items():
        hits = {v for _, v in literals if v in flags}
        if hits:
            found[rel] = hits
    extra = {m: sorted(h - FLAG_LITERALS.get(m, (set(), ""))[0]) for m, h in found.items()}
    assert {m: h for m, h in extra.items() if h} == {}, "declare the option from FIELDS"
    stale = {m: sorted(allowed - found.get(m, set()))
             for m, (allowed, _) in FLAG_LITERALS.items()}
    assert {m: s for m, s in stale.items() if s} == {}, "remove them from FLAG_LITERALS"


def test_no_config_key_is_written_outside_the_table() -> None:
    keys = {f.key for f in FIELDS.values() if f.key}
    hyphens = {k.replace("_", "-") for k in keys} - keys
    accessed, spelt = {}, {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "server/fields.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        allowed = KEY_LITERALS.get(rel, (set(), ""))[0]
        hits = sorted({f"{v}:{line}" for line, v in _config_keys_accessed(tree)
                       if v in keys - allowed})
        if hits:
            accessed[rel] = hits
        old = {n.value for n in ast.walk(tree)
               if isinstance(n, ast.Constant) and n.value in hyphens}
        if old - HYPHEN_LITERALS.get(rel, (set(), ""))[0]:
            spelt[rel] = sorted(old)
    assert accessed == {}, "read and write run configs through FIELDS (plan_from_config, ...)"
    assert spelt == {}, "the config keys are spelt with underscores"
    for rel, (allowed, _) in (*HYPHEN_LITERALS.items(), *KEY_LITERALS.items()):
        text = (SRC / rel).read_text(encoding="utf-8")
        assert all(f'"{v}"' in text for v in allowed), f"{rel}: remove it from the list"


def test_the_config_scan_finds_a_hand_written_key() -> None:
    """The scan of the previous test sees each way a key can be read or written."""
    code = ('cfg["dp_epsilon"]; run_cfg.get("clip_norm"); cfg_int(cfg, "limbs"); '
            '"store" in node_cfg; config = {"heads": "nb"}; cfg.update({"seed": 1})')
    got = {v for _, v in _config_keys_accessed(ast.parse(code))}
    assert got == {"dp_epsilon", "clip_norm", "limbs", "store", "heads", "seed"}
