"""The benchmark scripts (bench/*.py) still fit the code they drive: nothing runs most of them but a GPU session, so a
refactor that renames or moves a name they use (``tools/train_tiny.py`` called ``Indexer._rope`` for weeks after it
went) breaks them silently. Four cheap checks:

- every script imports (a missing optional package skips it, naming the package; a missing name of ours fails);
- a static check of each script's references into our packages, in every function (the GPU-only code paths
  included): imports in any scope, ``module.attr``, ``Class.attr``, attributes of objects whose class is clear
  (``Engine`` from ``build_local_engine``, ``KVCache(...)``, annotated parameters, an unannotated ``engine``),
  call keywords and arguments missing or too many (``EngineConfig(...)``, ``SamplingParams(...)``,
  ``replace(cfg, ...)``, ``writer.write(staged, land)``), op names given to the kernel registry as strings, and
  the flags a script passes to ``glmserve serve``;
- ``--help`` of every argparse script (its parser builds; defaults name what still exists);
- short real runs on the CPU of benches that drive the engine API (engine_cpu, spec_accept, batch_decode).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import json
import sys
import textwrap
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))
OURS = ("bench", "cluster", "glmkernels", "models", "scheduler", "workers")
UNKNOWN = object()
# an unannotated parameter of these names is taken as this class (the benches' convention)
PARAM_CLASSES = {"engine": ("cluster.engine", "Engine")}


def _import_bench(stem: str) -> types.ModuleType:
    """``bench.<stem>``; skips where a package outside ours is missing (cupy, xgrammar, triton, ... without CUDA)."""
    try:
        return importlib.import_module(f"bench.{stem}")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in OURS:
            raise
        pytest.skip(f"bench/{stem}.py needs the optional package {exc.name!r}")


def test_scripts_found():
    assert len(SCRIPTS) >= 40 and "engine_cpu" in SCRIPTS and "decode_slice" in SCRIPTS


@pytest.mark.parametrize("stem", SCRIPTS)
def test_imports(stem):
    mod = _import_bench(stem)
    assert mod.__doc__, f"bench/{stem}.py: no docstring saying what it measures and how to run it"


# ---------------------------------------------------------------------------------------------------- static check

def _ours(obj) -> bool:
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None) or ""
    return name.split(".")[0] in OURS


def _module(name: str) -> types.ModuleType | None:
    """Our module ``name`` (imported), or another package's if already imported (a script's function-local
    ``import transformers`` is not worth its seconds here)."""
    if name.split(".")[0] not in OURS:
        return sys.modules.get(name)
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class Inst:
    """An instance of ``cls`` (a variable whose class the checker could tell)."""

    def __init__(self, cls: type):
        self.cls = cls

    def __eq__(self, other):
        return isinstance(other, Inst) and other.cls is self.cls

    def __hash__(self):
        return hash(self.cls)


_SELF_ATTRS: dict[type, set[str]] = {}
_IMPORTS: dict[str, dict] = {}


def _instance_attrs(cls: type) -> set[str]:
    """Names an instance of ``cls`` has beyond its class's: dataclass fields, annotations, slots, ``self.x = ...``
    anywhere in the class body, ``register_buffer("x", ...)`` / ``setattr(self, "x", ...)``."""
    if cls not in _SELF_ATTRS:
        names: set[str] = set()
        for k in cls.__mro__:
            if dataclasses.is_dataclass(k):
                names |= {f.name for f in dataclasses.fields(k)}
            names |= set(inspect.get_annotations(k))
            slots = k.__dict__.get("__slots__", ())
            names |= {slots} if isinstance(slots, str) else set(slots)
            try:
                tree = ast.parse(textwrap.dedent(inspect.getsource(k)))
            except (OSError, TypeError, SyntaxError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                        and isinstance(node.value, ast.Name) and node.value.id == "self":
                    names.add(node.attr)
                elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
                    fname = getattr(node.func, "attr", None) or getattr(node.func, "id", "")
                    args = node.args[1:] if fname == "setattr" else node.args
                    if fname in ("register_buffer", "register_parameter", "register_module", "add_module",
                                 "setattr") and args and isinstance(args[0], ast.Constant):
                        names.add(str(args[0].value))
        _SELF_ATTRS[cls] = names
    return _SELF_ATTRS[cls]


def _checkable(cls: type) -> bool:
    """Not a Protocol (its implementations add methods) and no ``__getattr__`` (names made on the fly)."""
    return _ours(cls) and not getattr(cls, "_is_protocol", False) \
        and not any("__getattr__" in k.__dict__ for k in cls.__mro__ if k is not object)


def _module_imports(modname: str) -> dict:
    """Names a module imports anywhere (``if TYPE_CHECKING:`` too): resolves its string annotations."""
    if modname not in _IMPORTS:
        out = {}
        try:
            tree = ast.parse(inspect.getsource(sys.modules[modname]))
        except (KeyError, OSError, TypeError):
            tree = ast.Module(body=[], type_ignores=[])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mod = _module(node.module)
                for alias in node.names:
                    if mod is not None and hasattr(mod, alias.name):
                        out[alias.asname or alias.name] = getattr(mod, alias.name)
        _IMPORTS[modname] = out
    return _IMPORTS[modname]


def _annotation(expr: ast.expr, fn):
    """Evaluate an annotation's AST in ``fn``'s module: a class, ("tuple", [items]) or UNKNOWN."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return _annotation(ast.parse(expr.value, mode="eval").body, fn)
    if isinstance(expr, ast.Name):
        g = getattr(fn, "__globals__", {})
        if expr.id in g:
            return g[expr.id]
        return getattr(builtins, expr.id, None) or _module_imports(getattr(fn, "__module__", "")).get(expr.id, UNKNOWN)
    if isinstance(expr, ast.Attribute):
        base = _annotation(expr.value, fn)
        return UNKNOWN if base is UNKNOWN else getattr(base, expr.attr, UNKNOWN)
    if isinstance(expr, ast.Subscript) and _annotation(expr.value, fn) is tuple:
        items = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        return ("tuple", [_annotation(e, fn) for e in items])
    return UNKNOWN


def _returns(fn):
    """What calling ``fn`` gives, from its return annotation: Inst, a list of Inst / UNKNOWN (a tuple), or UNKNOWN."""
    fn = inspect.unwrap(fn)
    raw = getattr(fn, "__annotations__", {}).get("return") if inspect.isfunction(fn) or inspect.ismethod(fn) else None
    if raw is None:
        return UNKNOWN
    try:
        ret = _annotation(ast.parse(raw, mode="eval").body, fn) if isinstance(raw, str) else raw
    except SyntaxError:
        return UNKNOWN
    if isinstance(ret, tuple) and ret[0] == "tuple":
        return [Inst(a) if isinstance(a, type) and _ours(a) else UNKNOWN for a in ret[1]]
    return Inst(ret) if isinstance(ret, type) and _ours(ret) else UNKNOWN


def _scope_nodes(node):
    """The nodes of one scope: nested functions / classes are yielded (their names bind here) but not entered."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield from _scope_nodes(child)


class RefChecker:
    """Walks one script scope by scope; each name bound in a scope gets one value (a module, class, function, an
    Inst) when every binding of it agrees, else UNKNOWN — only known values are checked."""

    def __init__(self, path: Path):
        self.path = path
        self.problems: list[str] = []
        self.envs: list[dict] = []
        self.checked = 0

    def fail(self, node, msg: str) -> None:
        self.problems.append(f"bench/{self.path.name}:{node.lineno}: {msg}")

    def lookup(self, name: str):
        for env in reversed(self.envs):
            if name in env:
                return env[name]
        return UNKNOWN

    def resolve(self, expr):
        if isinstance(expr, ast.Name):
            return self.lookup(expr.id)
        if not isinstance(expr, ast.Attribute):
            return UNKNOWN
        base = self.resolve(expr.value)
        if isinstance(base, (types.ModuleType, type)):
            return getattr(base, expr.attr, UNKNOWN)
        if isinstance(base, Inst):
            static = inspect.getattr_static(base.cls, expr.attr, UNKNOWN)
            if isinstance(static, (staticmethod, classmethod)) or inspect.isfunction(static):
                return getattr(base.cls, expr.attr)
            if isinstance(static, property) and static.fget is not None:
                return _returns(static.fget)
        return UNKNOWN

    def value_of(self, expr):
        if not isinstance(expr, ast.Call):
            return self.resolve(expr)
        fn = self.resolve(expr.func)
        if isinstance(fn, type):
            return Inst(fn) if _ours(fn) else UNKNOWN
        if fn is dataclasses.replace and expr.args:
            return self.resolve(expr.args[0])
        return _returns(fn) if callable(fn) and _ours(fn) else UNKNOWN

    def import_binding(self, node) -> list[tuple[str, object]]:
        out = []
        if isinstance(node, ast.Import):
            for alias in node.names:
                mod = _module(alias.name)
                if alias.name.split(".")[0] in OURS:
                    self.checked += 1
                    if mod is None:
                        self.fail(node, f"import {alias.name}: no such module")
                top = alias.name.split(".")[0]
                out.append((alias.asname, mod) if alias.asname else (top, _module(top)))
        elif node.module and node.level == 0:
            mod, ours = _module(node.module), node.module.split(".")[0] in OURS
            if ours:
                self.checked += 1
                if mod is None:
                    self.fail(node, f"from {node.module} import ...: no such module")
            for alias in node.names:
                val = getattr(mod, alias.name, None) if mod is not None else None
                if val is None and mod is not None:
                    val = _module(f"{node.module}.{alias.name}")
                    if val is None and ours:
                        self.fail(node, f"from {node.module} import {alias.name}: {node.module} has no {alias.name!r}")
                out.append((alias.asname or alias.name, UNKNOWN if val is None else val))
        return [(name, UNKNOWN if val is None else val) for name, val in out]

    def scope_env(self, body: list, args: ast.arguments | None = None) -> dict:
        binds: dict[str, list] = {}
        for a in [] if args is None else [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is None:
                continue
            val = UNKNOWN
            if a.annotation is not None:
                ann = self.resolve(a.annotation) if not isinstance(a.annotation, ast.Constant) else \
                    self.resolve(ast.parse(a.annotation.value, mode="eval").body)
                val = Inst(ann) if isinstance(ann, type) and _ours(ann) else UNKNOWN
            elif a.arg in PARAM_CLASSES:
                val = Inst(getattr(importlib.import_module(PARAM_CLASSES[a.arg][0]), PARAM_CLASSES[a.arg][1]))
            binds.setdefault(a.arg, []).append(val)
        nodes = list(_scope_nodes(ast.Module(body=body, type_ignores=[])))
        assigns = [n for n in nodes if isinstance(n, ast.Assign)]
        assigned = {id(x) for n in assigns for t in n.targets for x in (t.elts if isinstance(t, ast.Tuple) else [t])}
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name, val in self.import_binding(node):
                    binds.setdefault(name, []).append(val)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                binds.setdefault(node.name, []).append(UNKNOWN)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and id(node) not in assigned:
                binds.setdefault(node.id, []).append(UNKNOWN)       # for / with / augmented / walrus
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                for name in node.names:
                    binds.setdefault(name, []).append(UNKNOWN)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                binds.setdefault(node.name, []).append(UNKNOWN)
        self.envs.append({k: v[0] for k, v in binds.items() if len(set(map(id, v))) == 1})
        for node in assigns:                                        # their values may use this scope's imports
            val = self.value_of(node.value)
            for target in node.targets:
                items = target.elts if isinstance(target, ast.Tuple) else [target]
                vals = val if isinstance(val, list) and len(val) == len(items) and len(items) > 1 else \
                    [val if not isinstance(val, list) and len(items) == 1 else UNKNOWN] * len(items)
                for item, v in zip(items, vals):
                    if isinstance(item, ast.Name):
                        binds.setdefault(item.id, []).append(v)
        self.envs.pop()
        return {k: v[0] if all(x is not UNKNOWN and x == v[0] for x in v) else UNKNOWN for k, v in binds.items()}

    def check_attribute(self, node: ast.Attribute) -> None:
        base = self.resolve(node.value)
        if isinstance(base, types.ModuleType) and _ours(base):
            self.checked += 1
            if not hasattr(base, node.attr) and _module(f"{base.__name__}.{node.attr}") is None:
                self.fail(node, f"module {base.__name__} has no attribute {node.attr!r}")
        elif isinstance(base, type) and _checkable(base):
            self.checked += 1
            if not hasattr(base, node.attr) and node.attr not in _instance_attrs(base):
                self.fail(node, f"class {base.__module__}.{base.__qualname__} has no attribute {node.attr!r}")
        elif isinstance(base, Inst) and _checkable(base.cls):
            self.checked += 1
            if not hasattr(base.cls, node.attr) and node.attr not in _instance_attrs(base.cls):
                self.fail(node, f"a {base.cls.__module__}.{base.cls.__qualname__} has no attribute {node.attr!r}")

    def check_call(self, node: ast.Call) -> None:
        fn = self.resolve(node.func)
        if fn is dataclasses.replace and node.args:
            target = self.resolve(node.args[0])
            if isinstance(target, Inst) and dataclasses.is_dataclass(target.cls) and _ours(target.cls):
                self.checked += 1
                fields = {f.name for f in dataclasses.fields(target.cls)}
                for kw in node.keywords:
                    if kw.arg is not None and kw.arg not in fields:
                        self.fail(node, f"replace(): {target.cls.__qualname__} has no field {kw.arg!r}")
            return
        if not callable(fn) or isinstance(fn, types.ModuleType) or not _ours(fn):
            return
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return
        if isinstance(node.func, ast.Attribute) and isinstance(self.resolve(node.func.value), Inst) \
                and inspect.isfunction(fn):
            params = params[1:]                                     # a method looked up on an instance: self
        kinds = {p.kind for p in params}
        name = getattr(fn, "__qualname__", repr(fn))
        self.checked += 1
        if inspect.Parameter.VAR_KEYWORD not in kinds:
            known = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
            for kw in node.keywords:
                if kw.arg is not None and kw.arg not in known:
                    self.fail(node, f"{name}() has no parameter {kw.arg!r}")
        if any(isinstance(a, ast.Starred) for a in node.args) or any(kw.arg is None for kw in node.keywords):
            return
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if inspect.Parameter.VAR_POSITIONAL not in kinds and len(node.args) > len(positional):
            self.fail(node, f"{name}() takes {len(positional)} positional arguments, {len(node.args)} given")
        given = {kw.arg for kw in node.keywords}
        missing = [p.name for p in positional[len(node.args):] + [p for p in params if p.kind is p.KEYWORD_ONLY]
                   if p.default is p.empty and p.name not in given]
        if missing:
            self.fail(node, f"{name}() is missing {', '.join(map(repr, missing))}")

    def walk(self, node) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for child in [*getattr(node, "decorator_list", []), *node.args.defaults, *node.args.kw_defaults]:
                if child is not None:
                    self.walk(child)
            body = node.body if isinstance(node.body, list) else [node.body]
            self.envs.append(self.scope_env(body, node.args))
            for stmt in body:
                self.walk(stmt)
            self.envs.pop()
            return
        if isinstance(node, ast.ClassDef):
            for child in [*node.decorator_list, *node.bases]:
                self.walk(child)
            self.envs.append({})
            for stmt in node.body:
                self.walk(stmt)
            self.envs.pop()
            return
        if isinstance(node, ast.Attribute):
            self.check_attribute(node)
        elif isinstance(node, ast.Call):
            self.check_call(node)
        for child in ast.iter_child_nodes(node):
            self.walk(child)

    def run(self) -> list[str]:
        tree = ast.parse(self.path.read_text())
        self.envs.append(self.scope_env(tree.body))
        for stmt in tree.body:
            self.walk(stmt)
        self.check_strings(tree)
        return self.problems

    def check_strings(self, tree: ast.Module) -> None:
        """Names a script gives as strings: the kernel registry's op names (``ops.impl("x", "triton")``,
        ``ops._active["x"]``) and the flags it passes to ``glmserve serve``."""
        from cluster.cli import parser
        from glmkernels import ops

        serve_flags = {s for a in parser()._subparsers._group_actions[0].choices["serve"]._actions
                       for s in a.option_strings}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "ops.impl" and len(node.args) == 2 \
                    and all(isinstance(a, ast.Constant) for a in node.args):
                self.checked += 1
                op, backend = (a.value for a in node.args)
                if backend not in ops._impls.get(op, {}):
                    self.fail(node, f"ops has no {backend!r} implementation of {op!r}")
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "ops._active" \
                    and isinstance(node.slice, ast.Constant):
                self.checked += 1
                if node.slice.value not in ops._impls:
                    self.fail(node, f"ops has no op {node.slice.value!r}")
            elif isinstance(node, ast.List) and len(node.elts) > 1 and "glmserve" in ast.unparse(node.elts[0]) \
                    and isinstance(node.elts[1], ast.Constant) and node.elts[1].value == "serve":
                for e in node.elts[2:]:
                    if isinstance(e, ast.Constant) and str(e.value).startswith("--"):
                        self.checked += 1
                        if e.value not in serve_flags:
                            self.fail(node, f"glmserve serve has no flag {e.value}")


@pytest.mark.parametrize("stem", SCRIPTS)
def test_references(stem):
    """Every name the script reaches in our packages exists, with the keywords it passes."""
    _import_bench(stem)                              # skips as test_imports does
    checker = RefChecker(ROOT / "bench" / f"{stem}.py")
    problems = checker.run()
    assert not problems, "a refactor left the bench behind:\n" + "\n".join(problems)


def test_reference_checker_catches_breaks(tmp_path):
    """The checker itself: each line below names something that is not there, inside a function nothing calls."""
    bad = tmp_path / "broken_bench.py"
    bad.write_text(textwrap.dedent('''
        import cluster.engine as engine_module
        from cluster.config import EngineConfig
        from cluster.local import build_local_engine
        from scheduler.request import SamplingParams


        def main(engine):
            from scheduler.shapes import no_such_function
            engine_module.graph_rows = None
            cfg = EngineConfig(device="cpu", no_such_field=1)
            SamplingParams(max_tokens=1, no_such_param=True)
            built, _ = build_local_engine(cfg)
            built.no_such_method()
            engine.no_such_attribute
            built.add_request([1, 2])
            ops._active["no_such_op"]
            ["glmserve", "serve", "--no-such-flag"]
        '''))
    problems = RefChecker(bad).run()
    expected = ["no_such_function", "'graph_rows'", "'no_such_field'", "'no_such_param'", "'no_such_method'",
                "'no_such_attribute'", "missing 'params'", "'no_such_op'", "--no-such-flag"]
    assert len(problems) == len(expected), problems
    for word, problem in zip(expected, problems):
        assert word in problem, (word, problem)


# ------------------------------------------------------------------------------------------------ --help and runs

HELP_SCRIPTS = [s for s in SCRIPTS if "ArgumentParser(" in (ROOT / "bench" / f"{s}.py").read_text()]


@pytest.mark.parametrize("stem", HELP_SCRIPTS)
def test_help(stem, monkeypatch, capsys):
    """``python bench/<stem>.py --help`` (run as __main__ in this process: the parser builds, its defaults exist)."""
    import runpy

    _import_bench(stem)
    path = str(ROOT / "bench" / f"{stem}.py")
    monkeypatch.setattr(sys, "argv", [path, "--help"])
    monkeypatch.setattr(sys, "path", list(sys.path))                 # a script may insert the repository root
    with pytest.raises(SystemExit) as done:
        runpy.run_path(path, run_name="__main__")
    assert done.value.code in (0, None) and "usage:" in capsys.readouterr().out


@pytest.fixture(scope="module")
def spec_engine():
    """The embedded tiny model with 2 MTP drafts, one process on the CPU (as engine_cpu / spec_accept build it)."""
    from cluster.config import EngineConfig
    from cluster.local import build_local_engine

    return build_local_engine(EngineConfig(device="cpu", kv_cache_tokens=4096, speculative_tokens=2,
                                           prefix_caching=False, warmup_tokens=0), progress=False)


def test_engine_cpu_and_spec_accept_run(spec_engine):
    """engine_cpu's and spec_accept's measuring loops on a real engine (add_request / step / events / stats /
    accepted_at / spec_metrics): an engine API rename fails here."""
    engine_cpu, spec_accept = _import_bench("engine_cpu"), _import_bench("spec_accept")
    engine, tok = spec_engine
    row = engine_cpu.run(engine, tok, 2, 3, "t")
    assert row["concurrency"] == 2 and row["tokens"] == 6 and row["ttft_ms"] > 0
    assert {"mean_accepted_length", "acceptance_by_position"} <= set(engine.spec_metrics())
    m = spec_accept.accept(engine, tok, {"temperature": 1.0}, True, 1, 3)
    assert m["rounds"] > 0 and m["proposed"] >= m["accepted"] >= 0 and len(m["by_pos"]) == 2
    assert not engine.has_unfinished()


def test_batch_decode_cpu(monkeypatch, capsys):
    """bench/batch_decode.py's plumbing on the CPU (the tiny widths): the graph-row cap it patches in, look-ahead,
    the schedulers' slack, the engine's step counters."""
    import runpy

    import scheduler.shapes

    _import_bench("batch_decode")
    monkeypatch.setattr(scheduler.shapes, "graph_rows", scheduler.shapes.graph_rows)   # restored whatever happens
    path = str(ROOT / "bench" / "batch_decode.py")
    monkeypatch.setattr(sys, "argv", [path, "--device", "cpu", "--requests", "2", "--caps", "1", "--ctx", "16",
                                      "--tokens", "6"])
    runpy.run_path(path, run_name="__main__")
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["graph_rows_max"] for r in rows] == [1, rows[1]["graph_rows_max"]] * 2 and rows[1]["graph_rows_max"] > 1
    assert [r["graph_steps"] for r in rows][::2] == [0, 0]                    # capped at 1 row: 2 requests run eager
    assert all(r["steps"] > 0 and r["step_ms"] > 0 for r in rows)
