"""Imports inside jes point one way: no module imports another that (transitively) imports it back.

Checked statically over every import statement, function-level ones included, so a cycle
cannot hide behind a lazy import.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "jes"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # "from pkg import sub" depends on pkg.sub when sub is a module, else on pkg itself
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            for target in targets:
                if target in modules and target != name and not (name == "jes" or target == "jes"):
                    if not name.startswith(target + "."):  # a submodule importing its own package's __init__
                        edges.add(target)
        graph[name] = edges
    return graph


def test_no_import_cycles():
    graph = import_graph()
    assert "jes.generation" in graph and "jes.strategies.base" in graph
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt in graph and not (node.startswith(nxt + ".") or nxt.startswith(node + ".")):
                if state.get(nxt) == "open":
                    cycle = stack[stack.index(nxt):] + [nxt]
                    pytest.fail("import cycle: " + " -> ".join(cycle))
                if nxt not in state:
                    visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_core_never_imports_host_services():
    graph = import_graph()
    core = ["jes.config", "jes.generation", "jes.rollout", "jes.policies", "jes.optimizers", "jes.envs"]
    core += [m for m in graph if m.startswith("jes.strategies")]
    host = {"jes.checkpoint", "jes.logging", "jes.loop", "jes.sweep", "jes.cli"}
    host |= {m for m in graph if m.startswith("jes.distributed")}

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    for module in core:
        if module in graph:
            assert not reach(module) & host, f"{module} reaches host services {sorted(reach(module) & host)}"


def test_no_benchmark_script_shadows_a_package():
    """A script runs with its own directory first on sys.path: benchmarks/brax.py made `import brax` (and
    benchmarks/gymnasium.py `import gymnasium`, which gymnax imports) find the script in every other benchmark."""
    import importlib.util

    benchmarks = ROOT.parent / "benchmarks"
    shadowing = [p.name for p in benchmarks.glob("*.py") if p.stem not in ("__init__",)
                 and (importlib.util.find_spec(p.stem) is not None and
                      pathlib.Path(importlib.util.find_spec(p.stem).origin or "").parent != benchmarks)]
    assert shadowing == [], f"rename these benchmark scripts, they shadow installed packages: {shadowing}"
