"""Code size: no module over 600 lines, no function over 80 code lines, no signature over 12
parameters (issue 21's bounds).

A module's lines are counted as the architecture report (``pyarch.py``) counts them: every
physical line that is not blank and does not start with ``#`` once stripped, so docstrings
count. A function's code line is a physical line holding code: blank lines, comment-only lines
and docstring lines (of modules, classes and functions) do not count, and its count covers its
whole body, nested functions included. Modules and functions already over a bound are listed in
an explicit allow-list with their size today: the test fails when one of them grows, when a new
offender appears, and when a listed one has shrunk under its bound (then remove it from the
list).

A function's parameters are its positional-only, positional and keyword-only ones, plus one for
``*args`` and one for ``**kwargs``; a leading ``self`` or ``cls`` does not count. Two kinds of
function are exempt from the parameter bound: the Typer CLI commands (functions in ``ghofl.cli``
decorated with ``<app>.command(...)`` or ``<app>.callback(...)``: one parameter per option) and
the constructors of the estimator classes in ``ghofl.heads`` (scikit-learn's ``get_params``
reads their explicit signature), whose shared hyperparameters are declared once (checked below).
"""

from __future__ import annotations

import ast
import inspect
import io
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_MODULE = 600
MAX_FUNCTION = 80
MAX_PARAMETERS = 12

#: Modules over MAX_MODULE lines (:func:`module_lines`) today, with their size (may shrink,
#: never grow).
KNOWN_LONG_MODULES: dict[str, int] = {
}

#: Functions over MAX_FUNCTION code lines today ("module:qualified name": size).
KNOWN_LONG_FUNCTIONS: dict[str, int] = {
}

#: Functions over MAX_PARAMETERS parameters today, besides the exempt ones ("module:qualified
#: name": parameters).
KNOWN_WIDE_FUNCTIONS: dict[str, int] = {
}


def code_lines(source: str) -> set[int]:
    """Line numbers (1-based) of ``source`` that hold code (not blank, comment or docstring)."""
    tree = ast.parse(source)
    doc: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                doc.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                        tokenize.DEDENT, tokenize.ENDMARKER, tokenize.ENCODING):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines - doc


def module_lines(source: str) -> int:
    """Lines of a module as ``pyarch`` counts them: not blank, not starting with ``#``."""
    return sum(1 for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#"))


def measure() -> tuple[dict[str, int], dict[str, int]]:
    """Lines per module (:func:`module_lines`) and code lines per function (``module:qualname``)
    over src/ghofl."""
    modules: dict[str, int] = {}
    functions: dict[str, int] = {}
    for path in sorted((SRC / "ghofl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(parts)
        source = path.read_text(encoding="utf-8")
        lines = code_lines(source)
        modules[module] = module_lines(source)

        _functions(ast.parse(source), module + ":", lines, functions)
    return modules, functions


def _functions(node: ast.AST, prefix: str, lines: set[int], out: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                end = child.end_lineno or child.lineno
                out[name] = len({n for n in lines if child.lineno <= n <= end})
            _functions(child, name + ".", lines, out)


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters of ``fn`` (see the module docstring: ``self``/``cls`` not counted, ``*args``
    and ``**kwargs`` one each)."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    n = len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return n - 1 if positional and positional[0].arg in ("self", "cls") else n


def _is_cli_command(module: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A Typer command or callback: in ``ghofl.cli``, decorated with ``X.command(...)`` or
    ``X.callback(...)``."""
    return (module == "ghofl.cli" or module.startswith("ghofl.cli.")) and any(
        isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
        and d.func.attr in ("command", "callback")
        for d in fn.decorator_list
    )


def _is_estimator_class(module: str, cls: ast.ClassDef) -> bool:
    """A head class of ``ghofl.heads`` (a base named ``Head`` or ``...Head``)."""
    bases = [ast.unparse(b).rpartition(".")[2] for b in cls.bases]
    return module.startswith("ghofl.heads.") and any(b.endswith("Head") for b in bases)


def parameters(tree: ast.Module, module: str) -> dict[str, int]:
    """Parameter count of every function of ``tree`` but the exempt ones (``module:qualname``)."""
    out: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str, owner: ast.ClassDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.", child)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                exempt = _is_cli_command(module, child) or (
                    child.name == "__init__" and owner is not None
                    and _is_estimator_class(module, owner))
                if not exempt:
                    out[f"{module}:{prefix}{child.name}"] = parameter_count(child)
                walk(child, f"{prefix}{child.name}.", None)

    walk(tree, "", None)
    return out


def measure_parameters() -> dict[str, int]:
    """Parameters per function (``module:qualname``) over src/ghofl, exempt ones left out."""
    out: dict[str, int] = {}
    for path in sorted((SRC / "ghofl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.update(parameters(ast.parse(path.read_text(encoding="utf-8")), ".".join(parts)))
    return out


def _check(sizes: dict[str, int], known: dict[str, int], bound: int, what: str,
           unit: str = "code lines", fix: str = "split them") -> None:
    over = {k: n for k, n in sizes.items() if n > bound}
    new = {k: n for k, n in over.items() if k not in known}
    assert not new, f"{what} over {bound} {unit}: {new}; {fix}"
    grown = {k: (known[k], n) for k, n in over.items() if k in known and n > known[k]}
    assert not grown, f"allow-listed {what} grew (allowed, now): {grown}; {fix}"
    done = sorted(k for k in known if sizes.get(k, 0) <= bound)
    assert not done, f"{done} are now within {bound} {unit}; remove them from the allow-list"


def test_counter_skips_docstrings_comments_and_blank_lines() -> None:
    src = 'def f(x):\n    """Doc.\n\n    More.\n    """\n    # note\n\n    return (x +\n            1)\n'
    assert sorted(code_lines(src)) == [1, 8, 9]


def test_module_counter_counts_docstrings_but_not_blank_or_comment_lines() -> None:
    src = ('"""Module.\n\nMore.\n"""\n\n# note\n    # indented note\nx = (1 +\n     2)  # tail\n'
           'def f():\n    """Doc."""\n')
    assert module_lines(src) == 7


def test_no_module_over_600_lines() -> None:
    _check(measure()[0], KNOWN_LONG_MODULES, MAX_MODULE, "modules", unit="lines")


def test_no_function_over_80_code_lines() -> None:
    _check(measure()[1], KNOWN_LONG_FUNCTIONS, MAX_FUNCTION, "functions")


def test_parameter_counter_skips_self_and_cls_and_counts_star_args_once() -> None:
    src = ("class A(Head):\n"
           "    def m(self, a, /, b, *args, c, d=1, **kw): ...\n"
           "    @classmethod\n"
           "    def k(cls, x): ...\n"
           "    def __init__(self, a, b): ...\n"
           "def f(me, a):\n"
           "    def inner(*, x, y): ...\n"
           "def g(): ...\n")
    assert parameters(ast.parse(src), "ghofl.tool") == {
        "ghofl.tool:A.m": 6, "ghofl.tool:A.k": 1, "ghofl.tool:A.__init__": 2,
        "ghofl.tool:f": 2, "ghofl.tool:f.inner": 2, "ghofl.tool:g": 0}
    # a head's constructor is exempt in ghofl.heads only; other methods are not
    assert set(parameters(ast.parse(src), "ghofl.heads.x")) == {
        "ghofl.heads.x:A.m", "ghofl.heads.x:A.k", "ghofl.heads.x:f", "ghofl.heads.x:f.inner",
        "ghofl.heads.x:g"}


def test_only_typer_commands_in_the_cli_are_exempt() -> None:
    src = ('@app.command("run")\ndef run(a, b): ...\n'
           "@stats_app.callback()\ndef main(a): ...\n"
           "@functools.cache\ndef helper(a): ...\n"
           "@app.command\ndef bare(a): ...\n")
    assert parameters(ast.parse(src), "ghofl.cli.tool") == {
        "ghofl.cli.tool:helper": 1, "ghofl.cli.tool:bare": 1}
    assert set(parameters(ast.parse(src), "ghofl.tool")) == {
        "ghofl.tool:run", "ghofl.tool:main", "ghofl.tool:helper", "ghofl.tool:bare"}


def test_no_function_over_12_parameters() -> None:
    _check(measure_parameters(), KNOWN_WIDE_FUNCTIONS, MAX_PARAMETERS, "functions",
           unit="parameters", fix="group related parameters into a small frozen dataclass")


def test_the_trainable_heads_declare_their_shared_hyperparameters_once() -> None:
    """The exempt constructors of the two trainable heads repeat the shared hyperparameters in
    their signatures (``get_params`` reads them); their checks live once, in
    ``FisherTrainedHead.parameter_constraints``, and the repeated annotations and defaults agree
    (ProtoHyperHead's docstring documents them as FisherMixHead's), except the AdamW settings
    each head sets to its paper values."""
    from ghofl.heads._training import FisherTrainedHead
    from ghofl.heads.fishermix import FisherMixHead
    from ghofl.heads.protohyper import ProtoHyperHead

    fm = inspect.signature(FisherMixHead.__init__).parameters
    ph = inspect.signature(ProtoHyperHead.__init__).parameters
    shared = (set(fm) & set(ph)) - {"self"}
    assert shared == set(FisherTrainedHead.parameter_constraints)
    for name in shared:
        assert fm[name].annotation == ph[name].annotation, name
        if name not in ("lr", "weight_decay", "batch_size"):
            assert fm[name].default == ph[name].default, name
