"""Where a Flower message's time goes on the node (issue 40): the run config key
``client-timings`` makes each reply of ghofl's ClientApp carry the seconds of the process's
start, imports, decoding, work and encoding (:mod:`ghofl.integrations.flower.timing`); without
it the replies are those of a run without timings, byte for byte.

Everything runs in process, through the ClientApp handler (no Flower processes).
"""

from __future__ import annotations

import builtins
import json
import math
import re
import sys
import threading
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.serde import recorddict_to_proto

from ghofl.client.job import ClientJob
from ghofl.client.stats_cache import cached_statistics
from ghofl.errors import ConfigError
from ghofl.integrations.flower import (
    TIMINGS_KEY,
    client_app,
    records,
    server_app,
    timing,
    transport,
)
from ghofl.integrations.flower.client_app import handle_query, run_setup
from ghofl.integrations.flower.eval_node import answer_model
from ghofl.integrations.flower.eval_server import _model_messages
from ghofl.integrations.flower.evaluation import EVAL_KEY, EVAL_SUMS
from ghofl.integrations.flower.records import message_to_record
from ghofl.integrations.flower.runner import identity_node_config, make_identities
from ghofl.integrations.flower.timing import (
    DECODE,
    ENCODE,
    IMPORTS,
    START,
    TIMING_FIELDS,
    WORK,
    ImportClock,
    process_age,
    timings_requested,
)
from ghofl.integrations.flower.transport import CLIENT_INFO
from ghofl.secure import PlainClient
from ghofl.secure.binding import answer_hello, hello_request
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.secure.messages import PROTOCOL_VERSION, PlainRequest
from ghofl.server import AggregationSpec, FederationPlan
from ghofl.server.config import plan_to_config
from ghofl.server.job import ServerJob, run_server_job
from tests.helpers import FakeGrid, gaussian_mixture, load_script
from tests.helpers_cli import write_npz

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ("0", "1", "2")
CLIP = 6.0
REQUEST = PlainRequest(PROTOCOL_VERSION, b"\x07" * 16, "input")
WORK_S, DECODE_S, ENCODE_S, IMPORT_S = 0.05, 0.15, 0.35, 0.75
BAD = (r"^run config key 'client-timings' must be true or false; got 'yes': fix it in the run "
       r"config \(flwr run --run-config\)$")


def _plain(tmp_path: Path, **extra: Any) -> tuple[Path, Context]:
    """A node's data file and the Context of a plain run (``extra``: more run config keys)."""
    x, y = gaussian_mixture(0, 3, 4, n=60)
    data = write_npz(tmp_path / "me.npz", x, y)
    run_cfg = {**plan_to_config(FederationPlan(ClientJob(CLASSES))), "data-template": "",
               **extra}
    node = {"data-path": str(data), "partition-id": 2}
    return data, Context(1, 7, node, RecordDict(), run_cfg)  # type: ignore[arg-type]


def _record(reply: RecordDict, key: str = CLIENT_INFO) -> dict[str, Any]:
    """A ConfigRecord of ``reply`` as a dict (its fields in their order)."""
    rec = reply[key]
    assert isinstance(rec, ConfigRecord)
    return dict(rec)


def _bytes(rd: RecordDict) -> bytes:
    return bytes(recorddict_to_proto(rd).SerializeToString(deterministic=True))


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test process's next message is a fresh process's first."""
    monkeypatch.setattr(timing, "_FRESH", [True])


@pytest.mark.parametrize("extra", [{}, {TIMINGS_KEY: False}])
def test_without_the_key_the_reply_is_the_one_without_timings(
        tmp_path: Path, extra: dict[str, Any], fresh: None) -> None:
    """The reply, serialised as Flower sends it, equals the reply built from the protocol
    reply and the node's info record (partition id, cache flag, seconds) alone."""
    data, ctx = _plain(tmp_path, **extra)
    reply = handle_query(message_to_record(REQUEST), ctx)
    info = _record(reply)
    assert list(info) == ["partition-id", "stats-cached", "seconds"]
    job = run_setup(1, dict(ctx.run_config)).job
    stats, _ = cached_statistics(data, job, None)
    expected = message_to_record(PlainClient("node-7", stats).handle(REQUEST),
                                 transport_dtype=job.transport_dtype)
    expected[CLIENT_INFO] = ConfigRecord({"partition-id": 2, "stats-cached": False,
                                          "seconds": info["seconds"]})
    assert _bytes(reply) == _bytes(expected)


@pytest.fixture
def server_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a ServerApp process has set (messages can then be built)."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, attr, 1)


@pytest.mark.parametrize("extra", [{}, {TIMINGS_KEY: False}])
def test_without_the_key_hello_and_model_replies_are_those_without_timings(
        tmp_path: Path, extra: dict[str, Any], fresh: None, server_process: None) -> None:
    """The identity exchange's reply and the evaluation stage's reply to the model message,
    serialised, equal those built from their answers and the node's info record alone."""
    ids = make_identities(tmp_path / "ids", 1)
    data, ctx = _plain(tmp_path, **{EVAL_KEY: 0.25, **extra})
    ctx.node_config.update(identity_node_config(ids, 0))
    roster = Roster.load(ids / "roster.json")
    hello = hello_request(roster)
    reply = handle_query(message_to_record(hello), ctx)
    info = _record(reply)
    assert list(info) == ["partition-id", "seconds"]
    expected = message_to_record(answer_hello(hello, IdentityKey.load(ids / "site-0.key"),
                                              roster, "node-7"))
    expected[CLIENT_INFO] = ConfigRecord({"partition-id": 2, "seconds": info["seconds"]})
    assert _bytes(reply) == _bytes(expected)

    setup = run_setup(1, dict(ctx.run_config))
    total, _ = cached_statistics(data, setup.job, None)
    run_server_job(total, ServerJob(("nb",)), out_dir=tmp_path / "model")
    content = _model_messages(tmp_path / "model", {"node-7": 7})[0].content
    reply = handle_query(content, ctx)
    info = _record(reply)
    assert list(info) == ["partition-id", "seconds"]
    expected = answer_model(content, Context(1, 7, {}, RecordDict(), ctx.run_config),
                            setup, data)
    assert EVAL_SUMS in expected  # the node scored the model
    expected[CLIENT_INFO] = ConfigRecord({"partition-id": 2, "seconds": info["seconds"]})
    assert _bytes(reply) == _bytes(expected)


def _info_keys(info: dict[str, Any]) -> set[str]:
    return set(info) - {"partition-id", "stats-cached", "seconds"}


def test_with_the_key_each_reply_says_where_its_time_went(tmp_path: Path, fresh: None) -> None:
    """The first message of a process reports its start and the ClientApp module's imports;
    a later one neither. The parts add up to the handler's seconds."""
    _, ctx = _plain(tmp_path, **{TIMINGS_KEY: True})
    first = _record(handle_query(message_to_record(REQUEST), ctx))
    age_after = process_age()
    second = _record(handle_query(message_to_record(REQUEST), ctx))
    assert "refused" not in first
    has_age = age_after is not None
    assert _info_keys(first) == set(TIMING_FIELDS) - (set() if has_age else {START})
    assert _info_keys(second) == set(TIMING_FIELDS) - {START}
    for info in (first, second):
        assert all(isinstance(info[k], float) and info[k] >= 0 for k in _info_keys(info))
    assert first[IMPORTS] >= client_app._LOAD_S > 0
    handler = second[IMPORTS] + second[DECODE] + second[WORK] + second[ENCODE]
    assert handler <= second["seconds"] and second["seconds"] - handler < 0.5
    if has_age:  # the start and the module's imports lie within the process's age
        assert age_after is not None
        assert first[START] > 0 and first[START] + client_app._LOAD_S <= age_after + 0.02


def test_each_part_is_measured_where_its_time_is_spent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: None) -> None:
    """Slow decoding, work, a slow import during the work and slow encoding each land in
    their own field, not in another (lower bounds and their order only: no wall-clock upper
    bound on a loaded machine)."""
    module = tmp_path / "mods" / "ghofl_slow_import_probe.py"
    module.parent.mkdir()
    module.write_text(f"import time\ntime.sleep({IMPORT_S})\n")
    monkeypatch.syspath_prepend(str(module.parent))
    monkeypatch.delitem(sys.modules, "ghofl_slow_import_probe", raising=False)

    def slow(fn: Any, seconds: float) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            time.sleep(seconds)
            return fn(*args, **kwargs)
        return wrapped

    handle = PlainClient.handle

    def work(self: PlainClient, request: Any) -> Any:
        import ghofl_slow_import_probe  # type: ignore[import-not-found]  # noqa: F401

        time.sleep(WORK_S)
        return handle(self, request)

    monkeypatch.setattr(client_app, "message_from_record",
                        slow(records.message_from_record, DECODE_S))
    monkeypatch.setattr(client_app, "message_to_record", slow(records.message_to_record, ENCODE_S))
    monkeypatch.setattr(PlainClient, "handle", work)
    _, ctx = _plain(tmp_path, **{TIMINGS_KEY: True})
    info = _record(handle_query(message_to_record(REQUEST), ctx))
    assert "refused" not in info
    imports = info[IMPORTS] - client_app._LOAD_S  # the probe's import, this message's
    assert info[DECODE] >= DECODE_S and info[WORK] >= WORK_S and info[ENCODE] >= ENCODE_S
    assert imports >= IMPORT_S
    # each delay is above the sum of the smaller ones: a part counted in a smaller one's
    # field (the import in the work, the decoding in the work, ...) breaks the order
    assert info[WORK] < info[DECODE] < info[ENCODE] < imports


def test_a_timings_key_that_is_no_boolean_is_refused_naming_it(tmp_path: Path) -> None:
    _, ctx = _plain(tmp_path, **{TIMINGS_KEY: "yes"})
    info = _record(handle_query(message_to_record(REQUEST), ctx))
    assert _info_keys(info) == {"refused"}
    assert re.fullmatch(BAD, str(info["refused"]))
    with pytest.raises(ConfigError, match=BAD):
        timings_requested({TIMINGS_KEY: "yes"}, TIMINGS_KEY)
    assert timings_requested({}, TIMINGS_KEY) is False
    assert timings_requested({TIMINGS_KEY: True}, TIMINGS_KEY) is True


def test_the_server_refuses_a_timings_key_that_is_no_boolean_before_asking_a_node(
        tmp_path: Path) -> None:
    grid = FakeGrid([{"partition-id": 0}], {TIMINGS_KEY: "yes"}, unique_ids=True)
    cfg = {**plan_to_config(FederationPlan(ClientJob(CLASSES))), TIMINGS_KEY: "yes",
           "expected-nodes": 1}
    with pytest.raises(ConfigError, match=BAD):
        server_app.run_federation(grid, cfg, tmp_path / "out", {})
    assert grid.pushed == {} and grid.asked == 0


class _Replies:
    """A grid whose nodes' replies carry the given info records (the protocol reply: one
    node's real answer to :data:`REQUEST`)."""

    def __init__(self, body: RecordDict, infos: list[dict[str, Any]]) -> None:
        self.body, self.infos, self.ids = body, infos, [f"m{i}" for i in range(len(infos))]

    def push_messages(self, messages: list[Any]) -> list[str]:
        return self.ids[:len(messages)]

    def pull_messages(self, ids: set[str]) -> list[Any]:
        out = []
        for node, (mid, info) in enumerate(zip(self.ids, self.infos, strict=True)):
            content = RecordDict({k: v for k, v in self.body.items() if k != CLIENT_INFO})
            content[CLIENT_INFO] = ConfigRecord(info)
            out.append(SimpleNamespace(
                metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=mid),
                has_error=lambda: False, content=content))
        return out


def test_the_server_keeps_only_finite_seconds_at_least_zero(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        server_process: None) -> None:
    """NaN, infinities and negative seconds from a node are dropped (timings and the older
    ``seconds``), named once on stderr, and what is kept is valid JSON."""
    monkeypatch.setattr(transport, "_WARNED", [False])
    _, ctx = _plain(tmp_path)
    body = handle_query(message_to_record(REQUEST), ctx)
    nan, inf = math.nan, math.inf
    infos = [{"seconds": nan, IMPORTS: 0.25, DECODE: inf, WORK: -1.0, ENCODE: 0.5},
             {"seconds": 1.5, IMPORTS: -inf, DECODE: 0.0, WORK: nan, ENCODE: 2},
             {"seconds": -1.0, "partition-id": 1}]
    fl = transport.FlowerTransport(_Replies(body, infos), {"a": 0, "b": 1, "c": 2}, 5.0)
    got = dict(fl.exchange("input", dict.fromkeys("abc", REQUEST)))
    assert set(got) == {"a", "b", "c"} and fl.problems == {}
    assert fl.traffic["input"].client_seconds == {"b": 1.5}
    assert fl.client_timings == {"input": {"a": {IMPORTS: 0.25, ENCODE: 0.5},
                                           "b": {DECODE: 0.0, ENCODE: 2.0, "seconds": 1.5}}}
    json.dumps({"t": fl.client_timings, "s": fl.traffic["input"].client_seconds},
               allow_nan=False)
    err = capsys.readouterr().err
    assert err.count("ghofl: dropped the field") == 1
    assert re.search(r"dropped the field 'seconds' = nan of a's input reply: not a finite "
                     r"number of seconds >= 0", err)


def test_the_server_work_of_a_stage_excludes_the_wait_for_replies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_process: None) -> None:
    """``server_seconds``: the stage's seconds less the wait inside ``send_and_receive``; what
    the caller does with each reply counts (lower bounds from the sleeps: no upper bound on
    a loaded machine)."""
    _, ctx = _plain(tmp_path)
    body = handle_query(message_to_record(REQUEST), ctx)
    fl = transport.FlowerTransport(_Replies(body, [{}, {}]), {"a": 0, "b": 1}, 5.0)
    real = transport.send_and_receive

    def slow(*args: Any, **kwargs: Any) -> list[Any]:
        time.sleep(0.2)  # the nodes' time: waiting, not the server's work
        out: list[Any] = real(*args, **kwargs)
        return out

    monkeypatch.setattr(transport, "send_and_receive", slow)
    for _ in fl.exchange("input", dict.fromkeys("ab", REQUEST)):
        time.sleep(0.1)  # the caller's work on each reply
    assert fl.server_seconds["input"] >= 0.2
    assert fl.stage_seconds["input"] - fl.server_seconds["input"] >= 0.2


def test_process_age_reads_proc_and_is_none_where_it_cannot(tmp_path: Path) -> None:
    import os

    hz = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    fields = ["S", *map(str, range(4, 22)), str(50 * hz), "0"]  # fields 3..23; 22 = start
    stat.write_text(f"123 (a b) c) {' '.join(fields)}\n")
    uptime = tmp_path / "uptime"
    uptime.write_text("52.25 100.00\n")
    assert process_age(stat, uptime) == pytest.approx(2.25)
    assert process_age(stat, tmp_path / "absent") is None
    uptime.write_text("garbled")
    assert process_age(stat, uptime) is None
    stat.write_text("123 (short) S 1\n")
    assert process_age(stat, tmp_path / "uptime") is None
    if Path("/proc/self/stat").is_file():
        age = process_age()
        assert age is not None and age > 0


def test_the_import_clock_counts_this_threads_outermost_imports(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "ghofl_probe_outer.py").write_text(
        "import time\nimport ghofl_probe_inner\ntime.sleep(0.1)\n")
    (folder / "ghofl_probe_inner.py").write_text("import time\ntime.sleep(0.1)\n")
    (folder / "ghofl_probe_other.py").write_text("import time\ntime.sleep(0.3)\n")
    monkeypatch.syspath_prepend(str(folder))
    for name in ("ghofl_probe_outer", "ghofl_probe_inner", "ghofl_probe_other"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with ImportClock() as clock:
        other = threading.Thread(target=lambda: __import__("ghofl_probe_other"))
        other.start()
        other.join()
        assert "ghofl_probe_other" in sys.modules
        assert (clock.seconds, clock.statements) == (0.0, 0)  # the other thread's: not
        import ghofl_probe_outer  # type: ignore[import-not-found]  # noqa: F401
    assert "ghofl_probe_inner" in sys.modules
    assert clock.statements == 1  # the outer statement; the inner one within its time
    assert clock.seconds >= 0.2
    assert builtins.__import__ is timing._timed_import
    import ghofl_probe_inner  # type: ignore[import-not-found]  # noqa: F401
    assert clock.statements == 1  # a clock that has stopped counts nothing


def test_overlapping_clocks_of_two_threads_left_out_of_order_count_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Thread a enters its clock, then thread b; a leaves first. Each clock counts its own
    thread's import only, and ``builtins.__import__`` ends as the one wrapper (no clock's
    wrapper left installed)."""
    folder = tmp_path / "mods"
    folder.mkdir()
    delay = {"a": 0.05, "b": 0.2}
    for name, seconds in delay.items():
        (folder / f"ghofl_probe_{name}.py").write_text(f"import time\ntime.sleep({seconds})\n")
        monkeypatch.delitem(sys.modules, f"ghofl_probe_{name}", raising=False)
    monkeypatch.syspath_prepend(str(folder))
    entered = {n: threading.Event() for n in delay}
    imported = {n: threading.Event() for n in delay}
    a_left = threading.Event()
    clocks = {n: ImportClock() for n in delay}
    seen: dict[str, float] = {}

    def a() -> None:
        with clocks["a"]:
            entered["a"].set()
            entered["b"].wait(5)
            imported["b"].wait(5)
            seen["a before"] = clocks["a"].seconds  # b imported while both clocks ran
            __import__("ghofl_probe_a")
        a_left.set()

    def b() -> None:
        entered["a"].wait(5)
        with clocks["b"]:
            entered["b"].set()
            __import__("ghofl_probe_b")
            seen["b after"] = clocks["b"].seconds
            imported["b"].set()
            a_left.wait(5)  # a imports and leaves while b's clock runs
    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert a_left.is_set() and not any(t.is_alive() for t in threads)
    assert seen["a before"] == 0.0 and clocks["a"].statements == 1
    assert clocks["a"].seconds >= delay["a"]
    assert clocks["b"].seconds == seen["b after"] >= delay["b"]
    assert clocks["b"].statements == 1
    assert builtins.__import__ is timing._timed_import
    assert timing._THREAD.clocks == []


def test_the_server_keeps_every_nodes_timings_by_stage(tmp_path: Path,
                                                       server_process: None) -> None:
    """A secure round driven in process through the ServerApp: with the key, results.json's
    ``client_timings`` holds each stage's replies' fields by client; without it, none."""
    x, y = gaussian_mixture(0, 3, 4, n=120)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    for i in range(3):
        write_npz(tmp_path / f"client-{i}.npz", x[i::3], y[i::3])
    plan = FederationPlan(ClientJob(CLASSES, clip_norm=CLIP), AggregationSpec("secure"),
                          ServerJob(("nb",)))
    base = {**plan_to_config(plan), "dim": 4, "expected-nodes": 3, "stage-timeout-s": 30.0,
            "wait-timeout-s": 30.0, "data-template": str(tmp_path / "client-{partition_id}.npz")}
    nodes = [{"partition-id": i, "insecure-keys": True, "ledger": "none"} for i in range(3)]
    for on in (True, False):
        cfg = {**base, TIMINGS_KEY: on}
        out = server_app.run_federation(FakeGrid(nodes, cfg, unique_ids=True), cfg,
                                         tmp_path / f"out-{on}", {})
        assert out["status"] == "ok"
        if not on:
            assert "client_timings" not in out
            continue
        timings = out["client_timings"]
        assert {"advertise", "share", "mask", "unmask"} <= set(timings)
        for stage, by_client in timings.items():
            assert set(by_client) == {f"node-{i}" for i in range(3)}, stage
            for fields in by_client.values():
                assert set(TIMING_FIELDS) - {START} <= set(fields) <= {*TIMING_FIELDS, "seconds"}
                assert fields[WORK] <= fields["seconds"]


# ---------------------------------------------------------------------- the floor app
FLOOR = ROOT / "benchmarks" / "flower_floor_app"


@pytest.fixture
def floor(server_process: None) -> ModuleType:
    return load_script(FLOOR / "ghofl_floor" / "client_app.py",  # type: ignore[return-value]
                       "floor_client_timings")


def _floor_query(floor: ModuleType, run_cfg: dict[str, Any]) -> Message:
    msg = Message(RecordDict({"floor": ConfigRecord({"stage": "mask"})}), dst_node_id=1,
                  message_type="query")
    reply = floor.query(msg, Context(1, 1, {}, RecordDict(), run_cfg))
    assert isinstance(reply, Message)
    return reply


def test_the_floor_reports_the_same_start_and_its_handler(floor: ModuleType) -> None:
    cfg = {"stages": "advertise,mask", "reply-bytes": "0,100"}
    plain = _floor_query(floor, cfg).content
    assert list(plain.keys()) == ["floor"]  # without the key: the reply as it was
    floor._FRESH[0] = True
    first = _floor_query(floor, {**cfg, TIMINGS_KEY: True}).content
    second = _floor_query(floor, {**cfg, TIMINGS_KEY: True}).content
    assert _bytes(RecordDict({"floor": first["floor"]})) == _bytes(plain)
    has_age = floor.process_age() is not None
    assert set(_record(first, "timings")) == ({START, "seconds"} if has_age else {"seconds"})
    later = _record(second, "timings")
    assert set(later) == {"seconds"} and 0 <= later["seconds"] < 30.0
    assert list(_floor_query(floor, {"stages": "mask", "reply-bytes": ""}).content.keys()) == []


def test_both_apps_declare_the_key_off_by_default() -> None:
    import tomllib

    for app in (ROOT / "examples" / "flower_app", FLOOR):
        cfg = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
        assert cfg[TIMINGS_KEY] is False, app
