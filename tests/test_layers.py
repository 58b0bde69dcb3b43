"""The package's layers import downward only, and no module graph cycle hides behind function-local imports.

Every ``import`` in sigmatrace/ — at module level or inside a function — is read with ``ast``; each module
belongs to the layer of its package (``LAYERS``).  A module may import its own layer's modules and lower
layers, never a higher one, and the module graph (local imports included) has no cycle.
"""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "sigmatrace"

# lowest first; one rank per package (or top-level module)
LAYERS = [
    ("errors", "schema", "units", "_native", "progress"),
    ("format", "mlx5"),
    ("decode",),
    ("correlate",),
    ("tables",),
    ("export", "query"),
    ("analysis",),
    ("cluster",),
    ("report",),
    ("cli", "__main__", "__init__"),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path, pkg: Path) -> str:
    rel = path.relative_to(pkg.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(pkg=PKG):
    """{module: {imported sigmatrace module, ...}} with relative imports resolved."""
    graph = {}
    for path in pkg.rglob("*.py"):
        mod = _module_name(path, pkg)
        is_pkg = path.name == "__init__.py"
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    root = base[:len(base) - node.level + 1]
                    target = ".".join(root + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("sigmatrace"):
                    continue
                for alias in node.names:   # `from . import clock` names a module; `from .x import f` does not
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if (pkg.parent / (sub.replace(".", "/") + ".py")).exists()
                             or (pkg.parent / sub.replace(".", "/")).is_dir() else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("sigmatrace"))
        deps.discard(mod)
        graph[mod] = deps
    return graph


def _upward(graph, mod):
    return sorted(d for d in graph[mod] if d in graph and RANK[_layer(d)] > RANK[_layer(mod)])


def _cycles(graph):
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if d not in graph:
                continue
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


GRAPH = _imports()


def test_every_package_has_a_layer():
    missing = sorted({_layer(m) for m in GRAPH} - set(RANK))
    assert not missing, f"packages without a layer in tests/test_layers.py: {missing}"


@pytest.mark.parametrize("mod", sorted(GRAPH))
def test_imports_go_downward(mod):
    up = _upward(GRAPH, mod)
    assert not up, f"{mod} (layer {_layer(mod)}) imports higher layers: {up}"


def test_no_import_cycle():
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_upward_and_circular_imports(tmp_path):
    """The rules fail on what they forbid: a fake package whose format module imports the CLI inside a
    function, and whose CLI imports that module back."""
    pkg = tmp_path / "sigmatrace"
    for d in ("format", "cli"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "format" / "reader.py").write_text("def f():\n    from ..cli import main\n    return main\n")
    (pkg / "cli" / "main.py").write_text("from ..format.reader import f\n")
    graph = _imports(pkg)
    assert _upward(graph, "sigmatrace.format.reader") == ["sigmatrace.cli.main"]
    assert ["sigmatrace.cli.main", "sigmatrace.format.reader", "sigmatrace.cli.main"] in _cycles(graph)
