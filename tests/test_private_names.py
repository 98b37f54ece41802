"""No module of the `gateway` package but gateway/downstream/aiohttp_internals.py uses a private
name of a dependency (whatever is imported from outside `gateway`, the standard library
included).

A private name is one with a leading underscore that is not a dunder. The check reads each
module's `ast`, without running it, so it has to guess what a value is; the heuristic:

1. **Private imports**: `import pkg._x`, `from pkg._x import y`, `from pkg import _x`.
2. **Through an imported name**: `X._x` where the expression starts with a name imported from a
   dependency (`asyncio._get_running_loop()`, `web.StreamResponse._payload_writer`).
3. **Through a value of a dependency's type**: `v._x` where `v` is a parameter or variable
   annotated with a type that mentions an imported name (`response: web.StreamResponse`), or
   assigned from a call through one (`loop = asyncio.get_running_loop()`); and `self.v._x`
   where the class annotates `self.v` that way.
4. **Subclasses of a dependency's class**: in a class with such a base, a class-level `_x`
   (an attribute or a method: `_send_headers_immediately = False`, `def _make_server`) and a
   `self._x` / `super()._x` whose name the base class has. The base is imported to ask it:
   `dir()` lists its class attributes, methods and `__slots__` (how aiohttp's RequestHandler
   declares its instance state). A subclass's own new private attributes are fine, until
   the base grows one of the same name: then the clash is flagged.
5. **Backstop for values of unknown type**: `v._x` where `_x` is a private attribute that the
   sources of aiohttp, prometheus_client or asyncio define on their objects (`self._x = ...`,
   a class-level `_x`, `__slots__`) and that gateway's own code never defines (if it does, the
   value is taken to be gateway's object: the upstream client's own `response._waiter`).

6. **Patches**: assigning to or deleting an attribute of an imported name, public or not
   (`prometheus_client.values.ValueClass = ...` changes the library for the whole process).

`self._x` and `cls._x` are the object's own (but see 4); `getattr(v, "_x")` counts as `v._x`.
Annotations are not uses: never evaluated (`from __future__ import annotations`), they may name
a type checker's private classes (typeshed's `zlib._Decompress`); and names from `typing` or
`collections.abc` do not make an annotation a dependency's type (`db: Any`).
The checker is itself checked: it must find each private use in aiohttp_internals.py, and
each rule must fire on a small example.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

import gateway

PACKAGE = Path(gateway.__file__).resolve().parent
ALLOWED = PACKAGE / "downstream" / "aiohttp_internals.py"
# Names with an underscore that are public, documented in their library's reference.
PUBLIC = frozenset({"os._exit"})
# Whose sources rule 5 reads for private attribute names.
BACKSTOP_DEPENDENCIES = ("aiohttp", "prometheus_client", "asyncio")
# Modules of types for annotations only: naming one of theirs is no dependency's value.
TYPING_MODULES = ("typing", "typing_extensions", "collections.abc", "types")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dependency(module: str | None, level: int = 0) -> bool:
    if level or not module:
        return False  # a relative import is gateway's own
    return module.split(".")[0] not in ("gateway", "__future__")


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _private_attribute(node: ast.AST) -> tuple[ast.expr, str] | None:
    """(the value, the private name) of `value._x` or `getattr(value, "_x"[, default])`."""
    if isinstance(node, ast.Attribute) and _private(node.attr):
        return node.value, node.attr
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and _private(node.args[1].value)
    ):
        return node.args[0], node.args[1].value
    return None


def _defined_private_names(tree: ast.AST) -> set[str]:
    """The private attributes a module's classes define: `self._x = ...`, class-level `_x`,
    `__slots__` entries; and its module-level private names."""
    names: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets, value = [node.target], node.value
        for target in targets:
            for each in ast.walk(target):
                if isinstance(each, ast.Attribute) and isinstance(each.value, ast.Name):
                    if each.value.id in ("self", "cls") and _private(each.attr):
                        names.add(each.attr)
                elif isinstance(each, ast.Name) and _private(each.id):
                    names.add(each.id)
            if isinstance(target, ast.Name) and target.id == "__slots__" and value:
                for each in ast.walk(value):
                    if isinstance(each, ast.Constant) and isinstance(each.value, str):
                        names.add(each.value)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
    return {name for name in names if _private(name)}


@cache
def _gateway_private_names() -> frozenset[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if path != ALLOWED:
            names |= _defined_private_names(ast.parse(path.read_text(), str(path)))
    return frozenset(names)


@cache
def _dependency_private_names() -> frozenset[str]:
    names: set[str] = set()
    for package in BACKSTOP_DEPENDENCIES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        for location in spec.submodule_search_locations:
            for path in Path(location).rglob("*.py"):
                tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
                # Object attributes only: a module's own private functions are rule 2's.
                module_level = {
                    name
                    for node in tree.body
                    for name in _defined_private_names(ast.Module([node], []))
                    if not isinstance(node, ast.ClassDef)
                }
                names |= _defined_private_names(tree) - module_level
    return frozenset(names)


@cache
def _class_private_names(module: str, path: tuple[str, ...]) -> frozenset[str] | None:
    """The private names `dir()` lists on the dependency's class `module.path`, or None when it
    cannot be imported (then every private override counts)."""
    try:
        value: object = importlib.import_module(module)
        for part in path:
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return None
    if not isinstance(value, type):
        return None
    names = {name for name in dir(value) if _private(name)}
    # Instance attributes outside __slots__ are not on the class: read them in its source.
    for klass in value.__mro__:
        if klass.__module__ != "builtins":
            try:
                source = textwrap.dedent(inspect.getsource(klass))
            except (OSError, TypeError):
                continue
            names |= _defined_private_names(ast.parse(source))
    return frozenset(names)


@dataclass
class _Scope:
    typed: set[str] = field(default_factory=set)  # names holding a dependency's value


class _Checker(ast.NodeVisitor):
    def __init__(self, source: str, filename: str) -> None:
        self.tree = ast.parse(source, filename)
        self.filename = filename
        self.imported: dict[str, tuple[str, tuple[str, ...]]] = {}  # name: (module, path)
        self.scopes = [_Scope()]
        # Per enclosing class: its dependency bases' private names (empty: no such base; None:
        # a base that cannot be imported), and its attributes annotated with a dependency's type.
        self.classes: list[tuple[frozenset[str] | None, set[str]]] = []
        self.found: list[str] = []
        self.typing_names: set[str] = set()
        self.annotations: set[int] = set()  # ids of the nodes inside annotations

    def run(self) -> list[str]:
        # Imports first, wherever they are: a function may use a module imported below it.
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _dependency(alias.name):
                        if any(_private(part) for part in alias.name.split(".")):
                            self.flag(node, f"import {alias.name}")
                        if alias.asname:
                            self.imported[alias.asname] = (alias.name, ())
                        else:
                            top = alias.name.split(".")[0]
                            self.imported[top] = (top, ())
            elif isinstance(node, ast.ImportFrom) and _dependency(node.module, node.level):
                assert node.module is not None
                if any(_private(part) for part in node.module.split(".")):
                    self.flag(node, f"from {node.module} import")
                for alias in node.names:
                    if _private(alias.name):
                        self.flag(node, f"from {node.module} import {alias.name}")
                    self.imported[alias.asname or alias.name] = (node.module, (alias.name,))
                    if node.module in TYPING_MODULES:
                        self.typing_names.add(alias.asname or alias.name)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in TYPING_MODULES:
                        self.typing_names.add(alias.asname or alias.name.split(".")[0])
        for node in ast.walk(self.tree):
            annotations: list[ast.expr | None] = []
            if isinstance(node, ast.arg | ast.AnnAssign):
                annotations = [node.annotation]
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                annotations = [node.returns]
            for annotation in annotations:
                if annotation is not None:
                    self.annotations.update(id(each) for each in ast.walk(annotation))
        self.visit(self.tree)
        return self.found

    def flag(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.filename}:{getattr(node, 'lineno', 0)}: {what}")

    # -- what a name or an annotation refers to --

    def _dependency_class(self, node: ast.expr) -> tuple[str, tuple[str, ...]] | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.insert(0, node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.imported:
            module, path = self.imported[node.id]
            return module, (*path, *parts)
        return None

    def _mentions_dependency(self, annotation: ast.expr | None) -> bool:
        if annotation is None:
            return False
        for node in ast.walk(annotation):
            if (
                isinstance(node, ast.Name)
                and node.id in self.imported
                and node.id not in self.typing_names
            ):
                return True
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                try:
                    quoted = ast.parse(node.value, mode="eval").body
                except SyntaxError:
                    continue
                if self._mentions_dependency(quoted):
                    return True
        return False

    def _from_dependency(self, value: ast.expr | None) -> bool:
        while isinstance(value, ast.Await):
            value = value.value
        if not isinstance(value, ast.Call):
            return False
        root = _root(value)
        return isinstance(root, ast.Name) and root.id in self.imported

    # -- scopes --

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = [self._dependency_class(base) for base in node.bases]
        dependency_bases = [base for base in bases if base is not None]
        typed_attributes: set[str] = set()
        for each in ast.walk(node):
            if isinstance(each, ast.AnnAssign) and self._mentions_dependency(each.annotation):
                target = each.target
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                    if target.value.id == "self":
                        typed_attributes.add(target.attr)
                elif isinstance(target, ast.Name):
                    typed_attributes.add(target.id)
        if dependency_bases:
            known: set[str] | None = set()
            for module, path in dependency_bases:
                names = _class_private_names(module, path)
                known = None if names is None or known is None else known | names
            base_names = None if known is None else frozenset(known)
            for statement in node.body:
                for name in self._class_level_names(statement):
                    if base_names is None or name in base_names:
                        self.flag(statement, f"class {node.name} overrides {name}")
            self.classes.append((base_names, typed_attributes))
        else:
            self.classes.append((frozenset(), typed_attributes))
        self.generic_visit(node)
        self.classes.pop()

    @staticmethod
    def _class_level_names(statement: ast.stmt) -> Iterator[str]:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            if _private(statement.name):
                yield statement.name
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                if isinstance(target, ast.Name) and _private(target.id):
                    yield target.id

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        scope = _Scope(set(self.scopes[-1].typed))
        arguments = node.args
        for argument in (
            *arguments.posonlyargs,
            *arguments.args,
            *arguments.kwonlyargs,
            arguments.vararg,
            arguments.kwarg,
        ):
            if argument is not None and self._mentions_dependency(argument.annotation):
                scope.typed.add(argument.arg)
        self.scopes.append(scope)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function
    visit_Lambda = _visit_function

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Name) and (
            self._mentions_dependency(node.annotation) or self._from_dependency(node.value)
        ):
            self.scopes[-1].typed.add(node.target.id)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if self._from_dependency(node.value):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.scopes[-1].typed.add(target.id)
        self.generic_visit(node)

    # -- the uses --

    def _check(self, node: ast.AST) -> None:
        use = _private_attribute(node)
        if use is None or id(node) in self.annotations:
            return
        value, name = use
        where = f"{ast.unparse(value)}.{name}"
        own = isinstance(value, ast.Name) and value.id in ("self", "cls")
        is_super = (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "super"
        )
        if own or is_super:
            if self.classes:
                base_names = self.classes[-1][0]
                if (base_names is None and is_super) or (base_names and name in base_names):
                    self.flag(node, f"{where} (a private name of the base class)")
            return
        root = _root(value)
        if where in PUBLIC:
            return
        if isinstance(root, ast.Name) and root.id in self.imported:
            self.flag(node, f"{where} (through {root.id}, imported)")
        elif isinstance(value, ast.Name) and value.id in self.scopes[-1].typed:
            self.flag(node, f"{where} ({value.id} holds a dependency's value)")
        elif (
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Name)
            and value.value.id == "self"
            and self.classes
            and value.attr in self.classes[-1][1]
        ):
            self.flag(node, f"{where} (self.{value.attr} holds a dependency's value)")
        elif name in _dependency_private_names() and name not in _gateway_private_names():
            self.flag(node, f"{where} (a private name of {', '.join(BACKSTOP_DEPENDENCIES)})")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._check(node)
        if isinstance(node.ctx, ast.Store | ast.Del):
            chain: ast.expr = node.value
            while isinstance(chain, ast.Attribute):
                chain = chain.value
            if isinstance(chain, ast.Name) and chain.id in self.imported:
                self.flag(node, f"{ast.unparse(node)} patched")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self._check(node)
        self.generic_visit(node)


def private_uses(source: str, filename: str = "<example>") -> list[str]:
    return _Checker(source, filename).run()


def test_no_module_but_aiohttp_internals_uses_a_dependencys_private_name() -> None:
    found = [
        use
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != ALLOWED
        for use in private_uses(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    ]
    assert not found, "move these into gateway/downstream/aiohttp_internals.py:\n" + "\n".join(
        found
    )


def test_the_check_finds_every_private_use_of_aiohttp_internals() -> None:
    found = "\n".join(private_uses(ALLOWED.read_text(), "aiohttp_internals.py"))
    for name in (
        "overrides _send_headers_immediately",
        "response._payload_writer",
        "handler._waiter",
        "handler._request_count",
        "inner._loop",
        "inner._kwargs",
        "self._loop",
        "self._kwargs",
        "overrides _make_server",
        "super()._make_server",
    ):
        assert name in found, (name, found)


@pytest.mark.parametrize(
    "source",
    [
        "import aiohttp._http_parser",
        "from aiohttp._websocket import reader",
        "from asyncio import _get_running_loop",
        "import asyncio\nasyncio._get_running_loop()",
        "from aiohttp import web\ndef f(r: web.StreamResponse) -> None:\n    r._eof_sent",
        "from aiohttp import web\ndef f(r: 'web.StreamResponse | None') -> None:\n    r._req",
        "import asyncio\nasync def f() -> None:\n    loop = asyncio.get_running_loop()\n"
        "    loop._ready",
        "from aiohttp import web\nclass A:\n    def __init__(self) -> None:\n"
        "        self.r: web.StreamResponse | None = None\n"
        "    def f(self) -> None:\n        self.r._body",
        "from aiohttp import web\nclass R(web.StreamResponse):\n    _eof_sent = True",
        "from aiohttp import web\nclass R(web.AppRunner):\n    async def _make_server(self): ...",
        "from aiohttp import web\nclass H(web.RequestHandler):\n"
        "    def f(self) -> None:\n        self._waiter",
        "def f(x) -> None:\n    x._payload_writer",
        "def f(x) -> None:\n    getattr(x, '_upper_bounds', None)",
        "from prometheus_client import values\nvalues.ValueClass = values.MutexValue",
        "import prometheus_client\ndel prometheus_client.values.ValueClass",
    ],
)
def test_each_rule_fires(source: str) -> None:
    assert private_uses(source), source


@pytest.mark.parametrize(
    "source",
    [
        "class A:\n    def __init__(self) -> None:\n        self._x = 1\n"
        "    def f(self, other: A) -> int:\n        return self._x + other._x",
        "from aiohttp import web\nclass H(web.RequestHandler):\n"
        "    def f(self) -> None:\n        self._deadline = None",
        "from aiohttp import web\ndef f(r: web.StreamResponse) -> int:\n    return r.__class__",
        "from gateway import metrics\nmetrics._something",
        "from . import sibling\nsibling._helper()",
    ],
)
def test_what_is_not_a_dependencys_private_name(source: str) -> None:
    assert not private_uses(source), source


if __name__ == "__main__":  # pragma: no cover
    for path in sorted(PACKAGE.rglob("*.py")):
        for use in private_uses(path.read_text(), str(path)):
            print(use, file=sys.stderr)
