"""No import cycle in src/: every ``import`` of the package (at module level or inside a function) walked with
ast; a module importing its own parent package does not count (Python runs the parent first anyway)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = {_module_name(p): p for p in (src / "ddtree_bench").rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in names:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                    found.append(sorted(component))
    return found


def test_the_walk_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_src():
    graph = import_graph()
    assert "ddtree_bench.catalog" in graph and graph["ddtree_bench.catalog"] == set()  # the ground floor
    assert cycles(graph) == []


# ----------------------------------------------------------------------------------------- import direction

#: The package's folders and top-level modules, from the ground floor up (docs/ARCHITECTURE.md): each may
#: import only from itself and from those below it.
LAYERS = (
    "catalog",
    "io",
    "validation",
    "bf16",
    "tree",
    "compile_cache",
    "environment",
    "paths",
    "progress",
    "supervise",
    "consistency",
    "acceptance",
    "drafter",
    "traces",
    "memory",
    "native_build",
    "cuda",
    "timing",
    "integrations",
    "builders",
    "ops",
    "k26",
    "config",
    "settings",
    "stages",
    "summary",
    "throughput",
    "calibrate",
    "report",
    "cli",
)


def layer(module: str) -> str | None:
    """The layer a module belongs to: its folder, or its own name at the package's top (None: the package)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_has_a_layer():
    assert {layer(m) for m in import_graph()} - {None} == set(LAYERS)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if None not in (layer(module), layer(target)) and rank[layer(target)] > rank[layer(module)]
    )


def test_no_folder_imports_one_above_it():
    assert upward_imports(import_graph()) == []


def test_the_direction_check_finds_an_upward_import():
    graph = {"ddtree_bench.k26.round": {"ddtree_bench.stages.draft", "ddtree_bench.ops.accept"}}
    assert upward_imports(graph) == ["ddtree_bench.k26.round imports ddtree_bench.stages.draft"]


def private_imports(src: Path = SRC) -> list[str]:
    """``from ddtree_bench.x import _name`` and ``module._name`` of an imported package module, across
    modules."""
    found = []
    for path in sorted((src / "ddtree_bench").rglob("*.py")):
        tree = ast.parse(path.read_text())
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddtree_bench"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(src)}: from {node.module} import {alias.name}")
                    modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name for a in node.names if a.name.startswith("ddtree_bench")}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{path.relative_to(src)}: {node.value.id}.{node.attr}")
    return found


def test_no_private_name_is_imported_across_modules():
    assert private_imports() == []


def test_the_private_name_check_finds_one(tmp_path):
    package = tmp_path / "ddtree_bench"
    package.mkdir()
    (package / "a.py").write_text("from ddtree_bench.b import _hidden\nfrom ddtree_bench import c\nc._x\n")
    assert private_imports(tmp_path) == [
        "ddtree_bench/a.py: from ddtree_bench.b import _hidden",
        "ddtree_bench/a.py: c._x",
    ]
