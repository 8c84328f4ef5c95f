"""No import runs against the data flow (formats -> model -> engine / trainer -> sync ->
metrics -> report), and no two modules import each other, lazily or not.

Each top-level package of quantroll/ has a rank; a module may import only from packages of
a lower rank (or its own). Imports inside functions count: a lazy import is still a
dependency, only deferred. A new package must be given a rank here, which is the point:
its place in the flow is decided, not discovered."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "quantroll"

RANKS = {
    "errors": 0, "version": 0,
    "jsonfields": 1, "compute": 1, "durable": 1, "inputs": 1, "metrics": 1, "formats": 1,
    "outputs": 1.5,  # the file layer: on durable, under everything that writes a directory (checkpoint's too)
    "locks": 2, "cli": 2, "kernels": 2, "tasks": 2, "checkpoint": 2,
    "model": 3, "builtin": 3,
    "engine": 4, "trainer": 4,
    "sync": 5,
    "distributed": 6, "evaluation": 6,
    "sft": 7, "compare": 7, "bench": 7,
    "rl": 8, "longsft": 8,
    "attribution": 9,
    "commands": 10,
    "__main__": 11, "__init__": 11,  # the package's facade (quantroll.Engine, ...)
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("quantroll",) + path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quantroll"):
            if node.module != "quantroll":  # `from quantroll import x` imports x, not the facade
                names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("quantroll"))
    return names


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_package_has_a_rank():
    packages = {_package(m) for m in _modules()}
    assert packages <= set(RANKS), f"give these packages a rank in RANKS: {sorted(packages - set(RANKS))}"


def test_no_import_runs_against_the_flow():
    back = []
    modules = _modules()
    for module, path in modules.items():
        src = _package(module)
        for target in _imports(path):
            parent, _, last = target.rpartition(".")
            if parent == "quantroll" and target not in modules and not (ROOT / last).is_dir():
                target = "quantroll"  # `from quantroll import __version__`: a name of the facade itself
            dst = _package(target)
            if dst != src and target in modules and RANKS[dst] >= RANKS[src]:
                back.append(f"{path.relative_to(ROOT.parent)} imports {target} ({src} {RANKS[src]} -> {dst} {RANKS[dst]})")
    assert not back, "imports against the data flow:\n" + "\n".join(sorted(back))


def test_no_two_modules_import_each_other():
    modules = _modules()
    graph = defaultdict(set)
    for module, path in modules.items():
        for target in _imports(path):
            if target in modules and target != module and not module.startswith(target + "."):
                graph[module].add(target)
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    assert not cycles, f"modules that import each other: {cycles}"
