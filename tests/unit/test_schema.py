"""The per-mode schema: layouts, flat vectors, and agreement of every former mode check."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.bench.runner import heads_for_mode
from ghofl.cli.io import check_mode
from ghofl.errors import (
    ConfigError,
    StatsFormatError,
    StatsValidationError,
    UnsupportedModeError,
)
from ghofl.heads.build import build_heads
from ghofl.heads.registry import available_heads, head_class, make_head
from ghofl.stats import ClientStats, ProjectionSpec, StatsMeta, compute_stats, save_stats
from ghofl.stats.codec import (
    expected_payload_nbytes,
    payload_nbytes,
    stats_from_tensors,
    stats_tensors,
)
from ghofl.stats.flat import unflatten_stats
from ghofl.stats.schema import (
    ARRAY_NAMES,
    SCHEMAS,
    ArraySpec,
    ModeSchema,
    mode_supports,
    modes_supporting,
    schema_for,
)
from tests.helpers import gaussian_mixture

MODES = tuple(SCHEMAS)
PAIRS = list(itertools.product(MODES, MODES))


def _stats(
    mode: str, seed: int = 0, c: int = 3, d: int = 5, projected: bool = False
) -> ClientStats:
    """Statistics of mode ``mode`` (C=c classes, dimension d; projected from 2d when asked),
    clipped at R=3 so n_clipped is non-zero."""
    in_dim = 2 * d if projected else d
    x, y = gaussian_mixture(seed, num_classes=c, dim=in_dim, n=20 * c)
    proj = ProjectionSpec(seed, in_dim, d) if projected else None
    return compute_stats(x, y, c, mode=mode, projection=proj, clip_norm=3.0)  # type: ignore[arg-type]


def _assert_identical(a: ClientStats, b: ClientStats) -> None:
    assert a.meta == b.meta
    assert a.n_clipped == b.n_clipped
    for name in ARRAY_NAMES:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), name


# ---------------------------------------------------------------------- the table itself
def test_table_holds_the_documented_arrays() -> None:
    assert {m: s.names for m, s in SCHEMAS.items()} == {
        "full": ("counts", "sums", "class_scatter"),
        "pooled": ("counts", "sums", "sq_sums", "scatter"),
        "gram": ("counts", "sums", "scatter"),
        "diag": ("counts", "sums", "sq_sums"),
        "means": ("counts", "sums"),
    }
    full, pooled = SCHEMAS["full"], SCHEMAS["pooled"]
    assert full.spec("class_scatter").stored_name == "class_scatter_triu"
    assert pooled.spec("scatter").stored_name == "scatter_triu"
    assert pooled.spec("sq_sums").stored_name == "sq_sums"
    assert pooled.spec("sq_sums").source == "diag_sums"
    assert pooled.spec("scatter").source == "total_scatter"
    assert [a.kind for a in full.arrays] == ["count", "first", "second"]
    assert full.spec("counts").dtype == np.int64 and full.spec("sums").dtype == np.float64
    assert set(ARRAY_NAMES) == {"counts", "sums", "sq_sums", "class_scatter", "scatter"}


@pytest.mark.parametrize(("mode", "required"), PAIRS)
def test_supports_table(mode: str, required: str) -> None:
    contains = {  # the partial order: gram and diag contain means, neither the other
        "full": {"full", "pooled", "gram", "diag", "means"},
        "pooled": {"pooled", "gram", "diag", "means"},
        "gram": {"gram", "means"},
        "diag": {"diag", "means"},
        "means": {"means"},
    }
    expected = required in contains[mode]
    assert schema_for(mode).supports(required) is expected  # type: ignore[arg-type]
    assert mode_supports(mode, required) is expected


@pytest.mark.parametrize("bad", ["half", "", "FULL", None])
def test_unknown_mode_names_the_valid_modes(bad: object) -> None:
    with pytest.raises(
        StatsValidationError,
        match=rf"unknown upload mode {bad!r}; valid modes are full, pooled, gram, diag, means",
    ):
        schema_for(bad)  # type: ignore[arg-type]
    with pytest.raises(StatsValidationError, match="unknown upload mode"):
        mode_supports("full", bad)  # type: ignore[arg-type]


def test_spec_of_an_array_the_mode_lacks() -> None:
    with pytest.raises(
        StatsValidationError,
        match=r"mode 'diag' statistics hold no array 'scatter'; they hold counts, sums, sq_sums",
    ):
        SCHEMAS["diag"].spec("scatter")
    assert SCHEMAS["diag"].has("sq_sums") and not SCHEMAS["diag"].has("scatter")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"axes": ("C", "k")}, r"array spec 'x' has axes \('C', 'k'\); expected a non-empty"),
        ({"axes": ()}, r"array spec 'x' has axes \(\); expected a non-empty tuple"),
        (
            {"axes": ("C", "d"), "symmetric": True},
            r"array spec 'x' is marked symmetric but its last two axes are \('C', 'd'\)",
        ),
    ],
)
def test_array_spec_rejects_bad_definitions(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {
        "name": "x",
        "axes": ("d", "d"),
        "dtype": np.dtype(np.float64),
        "kind": "second",
        "symmetric": False,
        "source": "x",
    }
    base.update(kwargs)
    with pytest.raises(StatsValidationError, match=match):
        ArraySpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("c", "d"), [(1, 1), (3, 4), (5, 9)])
def test_pack_unpack_and_shapes(mode: str, c: int, d: int) -> None:
    rng = np.random.default_rng(c * 10 + d)
    for spec in SCHEMAS[mode].arrays:  # type: ignore[index]
        arr = rng.normal(size=spec.shape(c, d))
        if spec.symmetric:
            arr = arr + np.swapaxes(arr, -1, -2)
        packed = spec.pack(arr)
        assert packed.shape == spec.packed_shape(c, d) and packed.flags.c_contiguous
        assert packed.size == spec.packed_size(c, d)
        np.testing.assert_array_equal(spec.unpack(packed, c, d), arr)


@pytest.mark.parametrize(
    ("name", "packed_shape", "match"),
    [
        (
            "class_scatter",
            (3, 9),
            r"array 'class_scatter_triu' must have shape \(3, 10\) \(row-major upper triangles\) "
            r"for C=3 classes and d=4; got \(3, 9\); the payload is corrupt",
        ),
        (
            "sums",
            (2, 4),
            r"array 'sums' must have shape \(3, 4\) for C=3 classes and d=4; got \(2, 4\)",
        ),
        ("counts", (3, 1), r"array 'counts' must have shape \(3,\) for C=3 classes and d=4"),
    ],
)
def test_unpack_checks_the_packed_shape(
    name: str, packed_shape: tuple[int, ...], match: str
) -> None:
    spec = SCHEMAS["full"].spec(name)
    with pytest.raises(StatsFormatError, match=match):
        spec.unpack(np.zeros(packed_shape), 3, 4)


# ---------------------------------------------------------------------- flat vectors
@pytest.mark.parametrize("projected", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_flatten_unflatten_round_trip_is_exact(mode: str, projected: bool) -> None:
    s = _stats(mode, seed=1, projected=projected)
    assert s.n_clipped > 0
    schema = schema_for(mode)
    ints, floats = schema.flatten(s)
    c, d = s.num_classes, s.dim
    assert ints.dtype == np.int64 and ints.shape == (c + 1,)
    assert floats.dtype == np.float64 and floats.shape == (schema.float_layout(c, d)[-1].stop,)
    assert ints[-1] == s.n_clipped
    back = unflatten_stats(s.meta, ints, floats)
    _assert_identical(back, s)
    ints[0] += 1  # the result owns its data
    floats[:] = 0.0
    _assert_identical(back, s)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("c", "d"), [(1, 1), (2, 3), (4, 7)])
def test_layouts_are_contiguous_and_sized_by_the_specs(mode: str, c: int, d: int) -> None:
    schema = schema_for(mode)
    for layout in (schema.int_layout(c, d), schema.float_layout(c, d)):
        assert layout[0].offset == 0
        assert all(b.offset == a.stop for a, b in itertools.pairwise(layout))
    ints = schema.int_layout(c, d)
    assert [(g.name, g.kind, g.size) for g in ints] == [("counts", "count", c), ("n_clipped", "count", 1)]
    floats = schema.float_layout(c, d)
    specs = [a for a in schema.arrays if a.name != "counts"]
    assert [(g.name, g.kind, g.size) for g in floats] == [
        (a.name, a.kind, a.packed_size(c, d)) for a in specs
    ]
    assert schema.nbytes(c, d) == 8 * (ints[-1].stop - 1 + floats[-1].stop)


@pytest.mark.parametrize("projected", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_nbytes_equals_the_array_bytes_save_stats_writes(
    tmp_path: Path, mode: str, projected: bool
) -> None:
    from safetensors.numpy import load_file

    s = _stats(mode, seed=2, c=4, d=6, projected=projected)
    save_stats(s, tmp_path / "s.ghs")
    written = sum(a.nbytes for a in load_file(str(tmp_path / "s.ghs")).values())
    nbytes = schema_for(mode).nbytes(4, 6)
    assert written == nbytes == payload_nbytes(s) == expected_payload_nbytes(mode, 4, 6)


def _vectors(mode: str = "pooled") -> tuple[ModeSchema, ClientStats, np.ndarray, np.ndarray]:
    s = _stats(mode, seed=3, c=3, d=4)
    schema = schema_for(mode)
    ints, floats = schema.flatten(s)
    return schema, s, ints, floats


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda i, f: (i[:-1], f),
            r"the integer vector of mode 'pooled' statistics for C=3 classes and d=4 must have "
            r"shape \(4,\) \(counts \(3,\), n_clipped \(1,\)\); got \(3,\); flatten and "
            r"unflatten with the same mode, class list and dimension",
        ),
        (
            lambda i, f: (np.append(i, 0), f),
            r"the integer vector of mode 'pooled' statistics .* got \(5,\)",
        ),
        (
            lambda i, f: (i, f[:-1]),
            r"the float vector of mode 'pooled' statistics for C=3 classes and d=4 must have "
            r"shape \(34,\) \(sums \(12,\), sq_sums \(12,\), scatter \(10,\)\); got \(33,\)",
        ),
        (
            lambda i, f: (i, np.append(f, 0.0)),
            r"the float vector of mode 'pooled' statistics .* got \(35,\)",
        ),
        (
            lambda i, f: (i, f.reshape(2, -1)),
            r"the float vector .* must have shape \(34,\) .*; got \(2, 17\)",
        ),
        (
            lambda i, f: (i.astype(np.float64), f),
            r"the integer vector of mode 'pooled' statistics must have an integer dtype; got "
            r"float64; pass the vector returned by ModeSchema.flatten",
        ),
        (
            lambda i, f: (i, f.astype(np.int64)),
            r"the float vector of mode 'pooled' statistics must have a floating-point dtype; "
            r"got int64",
        ),
    ],
)
def test_wrong_vectors_are_rejected(change: object, match: str) -> None:
    _, s, ints, floats = _vectors()
    bad_ints, bad_floats = change(ints, floats)  # type: ignore[operator]
    with pytest.raises(StatsValidationError, match=match):
        unflatten_stats(s.meta, bad_ints, bad_floats)


def test_unflatten_validates_the_statistics() -> None:
    _, s, ints, floats = _vectors()
    ints = ints.copy()
    ints[-1] = s.n_samples + 1
    with pytest.raises(StatsValidationError, match=r"n_clipped is \d+ but the statistics hold"):
        unflatten_stats(s.meta, ints, floats)
    ints[-1] = -1
    with pytest.raises(StatsValidationError, match=r"n_clipped .* must be a non-negative integer"):
        unflatten_stats(s.meta, ints, floats)
    ints[-1] = s.n_clipped
    floats = floats.copy()
    floats[0] = np.nan
    with pytest.raises(StatsValidationError, match="sums contains NaN or infinite values"):
        unflatten_stats(s.meta, ints, floats)


def test_unflatten_needs_metadata_of_its_mode() -> None:
    schema, s, ints, floats = _vectors("pooled")
    with pytest.raises(
        StatsValidationError,
        match=r"cannot unflatten with the 'pooled' schema statistics whose metadata has mode "
        r"'diag'; use schema_for\('diag'\)",
    ):
        schema.unflatten_arrays(s.meta.with_mode("diag"), ints, floats)


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_flatten_reads_richer_modes_through_the_sources(source: str, target: str) -> None:
    s = _stats(source, seed=4)
    schema = schema_for(target)
    if not mode_supports(source, target):
        with pytest.raises(
            StatsValidationError,
            match=rf"cannot flatten mode '{source}' statistics with the '{target}' schema",
        ):
            schema.flatten(s)
        return
    ints, floats = schema.flatten(s)
    back = unflatten_stats(s.meta.with_mode(target), ints, floats)  # type: ignore[arg-type]
    _assert_identical(back, s.to_mode(target))  # type: ignore[arg-type]


@st.composite
def _random_stats(draw: st.DrawFn) -> ClientStats:
    mode = draw(st.sampled_from(MODES))
    c = draw(st.integers(1, 4))
    d = draw(st.integers(1, 5))
    n = draw(st.integers(0, 30))
    seed = draw(st.integers(0, 2**32 - 1))
    projected = draw(st.booleans())
    clip = draw(st.one_of(st.none(), st.floats(0.1, 10.0)))
    rng = np.random.default_rng(seed)
    in_dim = d + 2 if projected else d
    x = rng.normal(scale=draw(st.floats(0.1, 5.0)), size=(n, in_dim))
    y = rng.integers(0, c, n)
    proj = ProjectionSpec(seed, in_dim, d) if projected else None
    return compute_stats(x, y, c, mode=mode, projection=proj, clip_norm=clip)


@settings(max_examples=80, deadline=None)
@given(_random_stats())
def test_random_stats_round_trip(s: ClientStats) -> None:
    schema = schema_for(s.mode)
    _assert_identical(unflatten_stats(s.meta, *schema.flatten(s)), s)


# ---------------------------------------------------------------------- former mode checks
def _meta(mode: str) -> StatsMeta:
    return StatsMeta(mode, 3, ("a", "b"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("mode", "name"), list(itertools.product(MODES, ARRAY_NAMES)))
def test_validation_requires_exactly_the_schema_arrays(mode: str, name: str) -> None:
    zeros: dict[str, np.ndarray | None] = dict(schema_for(mode).zeros(2, 3))
    if schema_for(mode).has(name):
        zeros[name] = None
        with pytest.raises(
            StatsValidationError, match=rf"mode '{mode}' statistics must hold {name}; it is missing"
        ):
            ClientStats(_meta(mode), **zeros)  # type: ignore[arg-type]
    else:
        zeros[name] = _zero_of(name)
        with pytest.raises(
            StatsValidationError,
            match=rf"mode '{mode}' statistics must not hold {name} \(it belongs to another mode\)",
        ):
            ClientStats(_meta(mode), **zeros)  # type: ignore[arg-type]


def _zero_of(name: str) -> np.ndarray:
    spec = next(a for s in SCHEMAS.values() for a in s.arrays if a.name == name)
    return np.zeros(spec.shape(2, 3), spec.dtype)


@pytest.mark.parametrize("mode", MODES)
def test_zeros_hold_exactly_the_schema_arrays(mode: str) -> None:
    z = ClientStats.zeros(_meta(mode))
    schema = schema_for(mode)
    for name in ARRAY_NAMES:
        arr = getattr(z, name)
        if schema.has(name):
            spec = schema.spec(name)
            assert arr.shape == spec.shape(2, 3) and arr.dtype == spec.dtype and not arr.any()
        else:
            assert arr is None
    assert z.n_clipped == 0


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_to_mode_follows_the_schema(source: str, target: str) -> None:
    s = _stats(source, seed=5)
    if not schema_for(source).supports(target):  # type: ignore[arg-type]
        with pytest.raises(
            StatsValidationError,
            match=rf"cannot convert statistics from mode '{source}' to mode '{target}', which "
            rf"holds second moments that mode '{source}' never collected; recompute them on the "
            rf"client with --mode {target}",
        ):
            s.to_mode(target)  # type: ignore[arg-type]
        return
    out = s.to_mode(target)  # type: ignore[arg-type]
    assert out.mode == target and out.n_clipped == s.n_clipped
    for spec in schema_for(target).arrays:
        np.testing.assert_array_equal(getattr(out, spec.name), getattr(s, spec.source))
    for name in ARRAY_NAMES:
        assert (getattr(out, name) is None) is not schema_for(target).has(name)


@pytest.mark.parametrize("mode", MODES)
def test_codec_tensors_are_the_stored_names(mode: str) -> None:
    s = _stats(mode, seed=6)
    t = stats_tensors(s)
    schema = schema_for(mode)
    assert list(t) == [a.stored_name for a in schema.arrays]
    assert all(t[a.stored_name].shape == a.packed_shape(3, 5) for a in schema.arrays)
    _assert_identical(stats_from_tensors(s.meta, t, s.n_clipped), s)


@pytest.mark.parametrize("mode", MODES)
def test_codec_rejects_missing_and_foreign_arrays(mode: str) -> None:
    s = _stats(mode, seed=7)
    t = stats_tensors(s)
    stored = [a.stored_name for a in schema_for(mode).arrays]
    missing = dict(t)
    del missing[stored[-1]]
    with pytest.raises(
        StatsFormatError,
        match=rf"statistics payload lacks the array '{stored[-1]}'; it is corrupt \(mode "
        rf"'{mode}' payloads hold {', '.join(stored)}\)",
    ):
        stats_from_tensors(s.meta, missing)
    foreign = next(
        a.stored_name for m in SCHEMAS.values() for a in m.arrays if a.stored_name not in stored
    )
    extra = {**t, foreign: np.zeros(3)}
    with pytest.raises(
        StatsFormatError,
        match=rf"statistics payload of mode '{mode}' holds unexpected array\(s\) '{foreign}'",
    ):
        stats_from_tensors(s.meta, extra)


HEADS = available_heads()


@pytest.mark.parametrize(("name", "mode"), list(itertools.product(HEADS, MODES)))
def test_head_mode_check_accepts_exactly_supported_modes(name: str, mode: str) -> None:
    head = make_head(name)
    if schema_for(mode).supports(head.min_mode):
        head._check_mode(_meta(mode))
    else:
        with pytest.raises(
            UnsupportedModeError,
            match=rf"head '{name}' needs upload mode '{head.min_mode}' or richer "
            rf"\({modes_supporting(head.min_mode)}\); the statistics are mode '{mode}'\. "
            rf"Recompute the client statistics with --mode {head.min_mode}",
        ):
            head._check_mode(_meta(mode))


@pytest.mark.parametrize(("name", "mode"), list(itertools.product(HEADS, MODES)))
def test_build_heads_accepts_exactly_supported_modes(name: str, mode: str) -> None:
    min_mode = head_class(name).min_mode
    if mode_supports(mode, min_mode):
        assert list(build_heads([name], mode=mode)) == [name]  # type: ignore[arg-type]
    else:
        with pytest.raises(
            UnsupportedModeError,
            match=rf"head '{name}' needs upload mode '{min_mode}' or richer "
            rf"\({modes_supporting(min_mode)}\), but the statistics are mode '{mode}'",
        ):
            build_heads([name], mode=mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_heads_for_mode_follows_the_schema(mode: str) -> None:
    expected = [h for h in HEADS if schema_for(mode).supports(head_class(h).min_mode)]
    assert heads_for_mode(tuple(HEADS), mode) == expected
    if mode not in ("means", "gram"):  # naive Bayes fits every mode with D_c
        assert heads_for_mode(("nb",), mode) == ["nb"]
    else:
        assert heads_for_mode(("nb", "ncm"), mode) == ["ncm"]
    if mode in ("gram", "pooled", "full"):  # the heads of the pooled scatter fit from B
        assert heads_for_mode(("lda", "ridge", "fed3r", "qda"), mode) == (
            ["lda", "ridge", "fed3r", "qda"] if mode == "full" else ["lda", "ridge", "fed3r"])


def test_modes_supporting_lists_the_modes_in_words() -> None:
    assert modes_supporting("gram") == "full, pooled or gram"
    assert modes_supporting("diag") == "full, pooled or diag"
    assert modes_supporting("full") == "full"


@pytest.mark.parametrize("mode", [*MODES, "half", "Full"])
def test_cli_check_mode_accepts_exactly_the_schema_modes(mode: str) -> None:
    if mode in SCHEMAS:
        assert check_mode(mode) == mode
    else:
        with pytest.raises(
            ConfigError, match=rf"--mode must be one of full, pooled, gram, diag, means; got '{mode}'"
        ):
            check_mode(mode)
