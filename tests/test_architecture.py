"""The structure the docs promise, checked on the source: layers, no cycles (of modules and of folders),
function sizes, a generated CLI reference.

Layers, top to bottom. A module may import its own layer or any layer below it, never one above
(not even lazily inside a function). Each module's layer is that of the longest entry in
``LAYERS`` that is a prefix of its dotted name; a module no entry covers fails the test, so a new
package has to be placed here on purpose.

    7 cli        aitbc_cli                          typer + rich front end: parse, call the SDK, render
    6 assistant  aitbc_agent_sdk.assistant          the chat assistant: tools over the SDK's steps
    5 facade     aitbc_agent_sdk (__init__),        the public API: Agent, the step-by-step flow
                 .agent, .flow
    4 services   .coordinator, .provider, .cluster, the daemons and round loops; stack wires ports
                 .devnet, .stack                    to backends, devnet starts the local services
    3 settings   .config, .profile, .settings,      AgentConfig, the saved devnet profile, the user's
                 .coordinator.settings              config file and networks by name; a component's
                                                    own settings that AgentConfig nests
      host       .host                              what provider and cluster share about the machine
    2 ports      .market, .storage, .messaging,     ports, their adapters and pure strategies;
                 .chain, .audit, .tasks, .data,     audit is the append-only log file; the
                 .wire, .aggregate, .proof          torch side: tasks, datasets, codecs, rules, proofs
    1 base       .records, .errors, .limits, ._lazy records, the error root, bounds, lazy re-exports

How imports are read (AST, nothing is imported):
- every ``import``/``from ... import`` anywhere in a module counts: at the top, inside functions
  and inside ``if TYPE_CHECKING:`` blocks (a type-only import still ties a lower layer to a
  higher one);
- the cycle check leaves out ``if TYPE_CHECKING:`` imports, which never run; lazy imports inside
  functions do count (a cycle broken only by deferring the import is still a cycle);
- ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``;
- the implicit import of a parent package's ``__init__`` is not an edge (``aitbc_agent_sdk``'s is
  a lazy facade), and neither are names ``_lazy`` resolves from strings.

Folders: the SDK's folders (and top-level modules) form no circle either, type-only imports
included, and the services do not lean on each other: only ``stack`` (the wiring) imports its
siblings ``provider`` and ``devnet``; coordinator, provider, cluster and devnet import none of them.

Sizes: a module is as long as its one idea (no line cap: splitting for size made mixins). A
function over ``MAX_FUNCTION_LINES`` (from its ``def`` to its last line, nested functions included)
needs its reason written down: a ``# Long because: ...`` comment between its ``def`` and its first
statement (its docstring excepted).
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"aitbc_agent_sdk": ROOT / "aitbc_agent_sdk", "aitbc_cli": ROOT / "cli" / "aitbc_cli"}

LAYERS: dict[str, tuple[int, str]] = {
    "aitbc_cli": (7, "cli"),
    "aitbc_agent_sdk.assistant": (6, "assistant"),
    "aitbc_agent_sdk": (5, "facade"),  # the package __init__ only: every submodule has a longer entry
    "aitbc_agent_sdk._agent": (5, "facade"),
    "aitbc_agent_sdk.flow": (5, "facade"),
    "aitbc_agent_sdk.coordinator": (4, "services"),
    "aitbc_agent_sdk.provider": (4, "services"),
    "aitbc_agent_sdk.cluster": (4, "services"),
    "aitbc_agent_sdk.devnet": (4, "services"),
    "aitbc_agent_sdk._stack": (4, "services"),
    # What provider and cluster share about the machine (hardware readers, env scrubbing, sandbox):
    # below both, so neither imports the other; beside settings, as the sandbox reads default_home.
    "aitbc_agent_sdk.host": (3, "host"),
    "aitbc_agent_sdk.config": (3, "settings"),
    "aitbc_agent_sdk.profile": (3, "settings"),
    "aitbc_agent_sdk.settings": (3, "settings"),
    # A component's own pydantic settings, nested in AgentConfig: settings layer, whatever its package.
    "aitbc_agent_sdk.coordinator._settings": (3, "settings"),
    "aitbc_agent_sdk.market": (2, "ports"),
    "aitbc_agent_sdk.storage": (2, "ports"),
    "aitbc_agent_sdk.messaging": (2, "ports"),
    "aitbc_agent_sdk.chain": (2, "ports"),
    "aitbc_agent_sdk.tasks": (2, "ports"),
    "aitbc_agent_sdk.data": (2, "ports"),
    "aitbc_agent_sdk.wire": (2, "ports"),
    "aitbc_agent_sdk.aggregate": (2, "ports"),
    "aitbc_agent_sdk.proof": (2, "ports"),
    "aitbc_agent_sdk.audit": (2, "ports"),
    "aitbc_agent_sdk.tracking": (2, "ports"),
    "aitbc_agent_sdk.records": (1, "base"),
    "aitbc_agent_sdk.errors": (1, "base"),
    "aitbc_agent_sdk.limits": (1, "base"),
    "aitbc_agent_sdk._lazy": (1, "base"),
}
MAX_FUNCTION_LINES = 60
REASON = "Long because:"
CLI_REFERENCE = ROOT / "scripts" / "cli_reference.py"
SERVICES = ("coordinator", "provider", "cluster", "devnet", "stack")
SERVICE_WIRING = {("stack", "provider"), ("stack", "devnet")}  # the only service-to-service imports
CLI_REFERENCE_PAGE = ROOT / "docs" / "reference" / "cli.md"  # the generated page the docs site shows
FRONT_ENDS = ("aitbc_cli", "aitbc_agent_sdk.assistant")
# Top-level modules that are themselves a public surface (no package to go through); _lazy is the
# plumbing every package __init__ uses.
PUBLIC_MODULES = {"aitbc_agent_sdk.errors", "aitbc_agent_sdk.profile", "aitbc_agent_sdk.settings",
                  "aitbc_agent_sdk.config", "aitbc_agent_sdk.audit", "aitbc_agent_sdk.limits", "aitbc_agent_sdk._lazy",
                  # what a user's torchrun script imports (``from aitbc_agent_sdk.cluster import ddp``)
                  "aitbc_agent_sdk.cluster.ddp"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (one of ours)
    line: int
    type_only: bool  # inside ``if TYPE_CHECKING:``


# -- reading the source ------------------------------------------------------------------------


@cache
def modules() -> dict[str, Path]:
    """Every module of both packages by dotted name (a package by its own name, for its __init__)."""
    found = {}
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


@cache
def tree(module: str) -> ast.Module:
    return ast.parse(modules()[module].read_text(encoding="utf-8"))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST, type_only: bool = False):
    """(import node, inside TYPE_CHECKING) for every import under ``node``, at any depth."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, type_only
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for part in child.body:
                yield from _import_nodes(ast.Module(body=[part], type_ignores=[]), True)
            for part in child.orelse:
                yield from _import_nodes(ast.Module(body=[part], type_ignores=[]), type_only)
        else:
            yield from _import_nodes(child, type_only)


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if modules()[module].name != "__init__.py":
        package.pop()  # a plain module's relative imports start at its package
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> list[Import]:
    known, found = modules(), []
    for node, type_only in _import_nodes(tree(module)):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _resolve(module, node)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target and target not in known:  # ``import a.b.c`` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != module:
                found.append(Import(module, target, node.lineno, type_only))
    return list(dict.fromkeys(found))  # ``from x import a, b`` is one edge


def layer(module: str) -> tuple[int, str] | None:
    best = max((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")),
               key=len, default=None)
    if best == "aitbc_agent_sdk" and module != best:
        return None  # a new top-level module of the SDK: place it in LAYERS
    return None if best is None else LAYERS[best]


def where(module: str, line: int | None = None) -> str:
    if module not in modules():
        return module  # a made-up module of a rule's own test
    path = modules()[module].relative_to(ROOT)
    return f"{path}:{line}" if line else str(path)


# -- the rules ---------------------------------------------------------------------------------


def unplaced_modules() -> list[str]:
    return [f"{where(m)} ({m}) has no layer in LAYERS" for m in modules() if layer(m) is None]


def upward_imports() -> list[str]:
    offenders = []
    for module in modules():
        mine = layer(module)
        for imp in imports_of(module):
            theirs = layer(imp.target)
            if mine and theirs and theirs[0] > mine[0]:
                kind = " (TYPE_CHECKING)" if imp.type_only else ""
                offenders.append(f"{where(module, imp.line)}: {module} [{mine[1]}] imports {imp.target} "
                                 f"[{theirs[1]}]{kind}")
    return offenders


def import_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), runtime imports only."""
    graph = {m: sorted({i.target for i in imports_of(m) if not i.type_only}) for m in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep import chain cannot hit the recursion limit.
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return cycles


def _cycle_lines(component: list[str]) -> str:
    members = set(component)
    edges = [f"    {where(i.source, i.line)}: {i.source} -> {i.target}"
             for m in component for i in imports_of(m) if i.target in members and not i.type_only]
    return "cycle of " + ", ".join(component) + ":\n" + "\n".join(edges)


def _has_reason(lines: list[str], first: int, last: int) -> bool:
    return any(line.lstrip().startswith("# " + REASON) for line in lines[first - 1:last])


def folder(module: str) -> str:
    """The SDK folder (or top-level module) a module belongs to: ``coordinator`` for
    ``aitbc_agent_sdk.coordinator.round._rounds``; the CLI is one folder."""
    parts = module.split(".")
    if parts[0] != "aitbc_agent_sdk":
        return parts[0]
    return parts[1].lstrip("_") if len(parts) > 1 else "aitbc_agent_sdk"  # _stack.py is folder "stack"


def folder_edges() -> dict[tuple[str, str], Import]:
    """One import (the first seen) for each pair of different folders, type-only imports included."""
    edges: dict[tuple[str, str], Import] = {}
    for module in modules():
        for imp in imports_of(module):
            pair = (folder(imp.source), folder(imp.target))
            if pair[0] != pair[1]:
                edges.setdefault(pair, imp)
    return edges


def folder_cycles(edges: dict[tuple[str, str], Import]) -> list[str]:
    """Every circle of folders, as 'a -> b -> a' with the import that makes each step."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    found = []
    for start in sorted(graph):
        paths = [[start]]
        while paths:  # breadth first from start; a circle is reported from its smallest folder
            path = paths.pop(0)
            for nxt in sorted(graph.get(path[-1], ())):
                if nxt == start:
                    steps = [edges[(x, y)] for x, y in zip(path, [*path[1:], start])]
                    found.append(" -> ".join([*path, start]) + ": " +
                                 "; ".join(f"{where(i.source, i.line)} imports {i.target}" for i in steps))
                elif nxt > start and nxt not in path:
                    paths.append([*path, nxt])
    return found


def services_leaning_on_each_other(edges: dict[tuple[str, str], Import]) -> list[str]:
    return [f"{where(imp.source, imp.line)}: {a} imports {b} ({imp.target})"
            for (a, b), imp in sorted(edges.items())
            if a in SERVICES and b in SERVICES and (a, b) not in SERVICE_WIRING]


def _front_end(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FRONT_ENDS)


def front_ends_past_the_surface(imports: list[Import]) -> list[str]:
    """Imports from the CLI or the assistant into the SDK that skip a package's ``__init__``."""
    known = modules()
    return [f"{where(i.source, i.line)}: {i.source} imports {i.target}; take it from its package"
            for i in imports
            if _front_end(i.source) and i.target.startswith("aitbc_agent_sdk") and not _front_end(i.target)
            and i.target not in PUBLIC_MODULES
            and not (i.target in known and known[i.target].name == "__init__.py")]


def long_functions() -> list[str]:
    offenders = []
    for module, path in modules().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(tree(module)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = node.end_lineno - node.lineno + 1
            if length <= MAX_FUNCTION_LINES:
                continue
            body = node.body
            first = body[1] if len(body) > 1 and ast.get_docstring(node) is not None else body[0]
            if not _has_reason(lines, node.lineno, first.lineno):
                offenders.append(f"{where(module, node.lineno)}: {node.name}() is {length} lines "
                                 f"(> {MAX_FUNCTION_LINES})")
    return offenders


def _fail_on(title: str, offenders: list[str]) -> None:
    if offenders:
        pytest.fail(f"{len(offenders)} {title}:\n" + "\n".join(offenders), pytrace=False)


# -- the tests ---------------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    _fail_on("modules outside the layer table", unplaced_modules())


def test_no_import_points_upward() -> None:
    _fail_on("upward imports (a lower layer importing a higher one)", upward_imports())


def test_no_import_cycles() -> None:
    _fail_on("import cycles", [_cycle_lines(c) for c in import_cycles()])


def test_no_circle_of_folders() -> None:
    _fail_on("circles of folders", folder_cycles(folder_edges()))


def test_the_services_do_not_lean_on_each_other() -> None:
    _fail_on("imports between services other than the wiring", services_leaning_on_each_other(folder_edges()))


def test_the_folder_rules_see_a_circle_and_a_sibling_import() -> None:
    """The folder checks on a made-up graph: a circle of three and a provider -> cluster import."""
    fake = {pair: Import(f"aitbc_agent_sdk.{pair[0]}.made_up", f"aitbc_agent_sdk.{pair[1]}.made_up", 1, False)
            for pair in [("training", "storage"), ("storage", "chain"), ("chain", "training"),
                         ("provider", "cluster"), ("stack", "provider")]}
    circles, leaning = folder_cycles(fake), services_leaning_on_each_other(fake)
    assert len(circles) == 1 and circles[0].startswith("chain -> training -> storage -> chain"), circles
    assert leaning == ["aitbc_agent_sdk.provider.made_up: provider imports cluster "
                       "(aitbc_agent_sdk.cluster.made_up)"], leaning


def public_implementation_modules() -> list[str]:
    """SDK modules that are neither a package's ``__init__``, a public top-level module, nor ``_private``."""
    return [f"{where(m)} ({m}) is public; name it _{path.name} and export what users need from its package"
            for m, path in modules().items()
            if m.startswith("aitbc_agent_sdk.") and path.name != "__init__.py" and not path.stem.startswith("_")
            and m not in PUBLIC_MODULES]


def test_implementation_modules_are_private() -> None:
    _fail_on("public implementation modules", public_implementation_modules())


def test_the_front_ends_use_the_package_surfaces() -> None:
    _fail_on("front-end imports past a package surface",
             front_ends_past_the_surface([i for m in modules() if _front_end(m) for i in imports_of(m)]))


def test_the_surface_rule_sees_a_reach_into_a_package() -> None:
    reach = Import("aitbc_cli.made_up", "aitbc_agent_sdk.coordinator.round._rounds", 3, False)
    fine = [Import("aitbc_cli.made_up", "aitbc_agent_sdk.coordinator", 4, False),
            Import("aitbc_agent_sdk.assistant.made_up", "aitbc_agent_sdk.errors", 5, False),
            Import("aitbc_agent_sdk.coordinator.made_up", "aitbc_agent_sdk.coordinator.round._rounds", 6, False)]
    assert front_ends_past_the_surface([reach, *fine]) == [
        "aitbc_cli.made_up: aitbc_cli.made_up imports aitbc_agent_sdk.coordinator.round._rounds; "
        "take it from its package"]


def test_no_function_over_the_limit_without_a_reason() -> None:
    _fail_on(f"functions over {MAX_FUNCTION_LINES} lines without '# {REASON}'", long_functions())


def test_the_checks_see_what_they_check(tmp_path: Path) -> None:
    """The walker itself: relative imports resolve, lazy and TYPE_CHECKING imports are seen."""
    targets = {i.target for i in imports_of("aitbc_agent_sdk.records._jobs")}
    assert "aitbc_agent_sdk.limits" in targets  # ``from .. import limits``
    everything = [i for m in modules() for i in imports_of(m)]
    assert any(i.type_only for i in everything)
    lazy = [i for i in everything if not i.type_only and not _top_level_line(i)]
    assert lazy, "no import inside a function found: the walker misses them"
    assert layer("aitbc_agent_sdk.coordinator.round._rounds") == (4, "services")
    assert layer("aitbc_agent_sdk.brand_new") is None
    assert folder("aitbc_agent_sdk._stack") == "stack" and folder("aitbc_agent_sdk.coordinator._service") == "coordinator"
    assert len(modules()) > 50


def _top_level_line(imp: Import) -> bool:
    return any(isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno == imp.line for n in tree(imp.source).body)


def _cli_reference_script() -> Any:
    spec = importlib.util.spec_from_file_location("cli_reference", CLI_REFERENCE)
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_cli_reference_covers_every_visible_command() -> None:
    script = _cli_reference_script()
    text = script.reference()
    root = script.root_command()
    paths = [ctx.command_path for _, ctx in script.walk(root, script._context_type(root)(root, info_name="aitbc"))]
    assert len(paths) > 20 and "aitbc distributed-training run" in paths
    assert all(f"### `{path}`" in text for path in paths)
    assert text.count("### `") == len(paths)
    assert "`--model-type`, `--model`" in text  # an alias next to its name
    assert "/_monitor" not in text and "aitbc cluster _monitor" not in text  # hidden commands stay out


def test_the_docs_cli_reference_is_generated_from_the_commands() -> None:
    done = subprocess.run([sys.executable, str(CLI_REFERENCE), "--check", str(CLI_REFERENCE_PAGE)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, (
        f"docs/reference/cli.md is stale or missing; run: "
        f"python scripts/cli_reference.py --write docs/reference/cli.md\n"
        f"{done.stdout[-3000:]}{done.stderr[-3000:]}")


def test_every_parameter_has_help_and_every_command_an_example() -> None:
    script = _cli_reference_script()
    root = script.root_command()
    builtin = {"help", "install_completion", "show_completion"}
    silent, no_example, leaves = [], [], 0
    for command, ctx in script.walk(root, script._context_type(root)(root, info_name="aitbc")):
        for param in command.get_params(ctx):
            if param.name not in builtin and not getattr(param, "hidden", False) \
                    and not (getattr(param, "help", None) or "").strip():
                silent.append(f"{ctx.command_path} {param.name}")
        if not hasattr(command, "list_commands"):
            leaves += 1
            if "Example" not in (command.help or ""):
                no_example.append(ctx.command_path)
    assert leaves > 20
    assert not silent, f"parameters without help text: {silent}"
    assert not no_example, f"commands whose help shows no example: {no_example}"
