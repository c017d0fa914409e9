"""The architecture, checked: no import cycle between the package's modules
(imports inside functions included), data flowing one way between the layers, and
tests laid out as the source is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The top-level folders install as evidentia.<folder> (see pyproject.toml).
PACKAGES = {"evidentia": "evidentia", "indexer": "evidentia.indexer", "retriever": "evidentia.retriever",
            "reranker": "evidentia.reranker", "api": "evidentia.api", "training": "evidentia.training",
            "evaluation": "evidentia.evaluation", "es_mappings": "evidentia.es_mappings"}

# Which layer may import which: a layer imports only from layers listed for it.
# core <- indexer <- retriever <- reranker <- engine <- (evaluation, training) <- cli, api
CORE = {"evidentia.config", "evidentia.records", "evidentia.text", "evidentia.language", "evidentia.store",
        "evidentia.runtime",
        "evidentia.tenants", "evidentia.progress", "evidentia.samples", "evidentia.es_mappings"}
LAYERS = {
    "core": set(),
    "indexer": {"core"},
    "retriever": {"core", "indexer"},
    "reranker": {"core", "retriever"},
    "engine": {"core", "indexer", "retriever", "reranker"},
    "evaluation": {"core", "indexer", "retriever", "reranker", "engine"},
    "training": {"core", "indexer", "retriever", "reranker", "engine", "evaluation"},
    "api": {"core", "indexer", "retriever", "reranker", "engine", "training"},
    "cli": {"core", "indexer", "retriever", "reranker", "engine", "evaluation", "training", "api"},
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if module in CORE or module.startswith("evidentia.es_mappings"):
        return "core"
    if len(parts) > 1 and parts[1] in ("indexer", "retriever", "reranker", "api", "training", "evaluation"):
        # each package's command-line module is part of the CLI layer
        return "cli" if parts[-1] in ("cli", "models_cli", "embed_cli") else parts[1]
    if module in ("evidentia.engine", "evidentia.indexing", "evidentia.library"):
        return "engine"
    return "cli"  # evidentia.cli, evidentia.console, evidentia.__init__


def module_files() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Every evidentia module ``module`` imports, at any depth of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    # imports under `if TYPE_CHECKING:` never run: they are annotations, not dependencies
    skipped = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
               for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        for name in names:
            # the longest known module the name refers to (a package, a module, or a symbol in one)
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    graph = {m: imports_of(m, p, known) for m, p in files.items()}
    # importing a package's submodule runs the package's __init__, which is not a dependency edge we track
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, deps in sorted(graph.items()):
        mine = layer_of(module)
        for dep in sorted(deps):
            theirs = layer_of(dep)
            if theirs != mine and theirs not in LAYERS[mine]:
                bad.append(f"{module} ({mine}) imports {dep} ({theirs})")
    return bad


def test_the_package_has_no_import_cycle():
    cycles = find_cycles(import_graph())
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_data_flows_one_way_between_layers():
    violations = layer_violations(import_graph())
    assert violations == [], "\n".join(violations)


def test_training_never_imports_the_api():
    """Training reads feedback and writes models (the guide's rule), its command-line
    modules too: the layer check counts those as the CLI's, which may import the API."""
    graph = import_graph()
    bad = [f"{module} imports {dep}" for module, deps in sorted(graph.items())
           if module.startswith("evidentia.training") for dep in sorted(deps) if dep.startswith("evidentia.api")]
    assert bad == [], "\n".join(bad)


def test_the_checker_finds_a_cycle_and_a_layer_violation():
    graph = {"evidentia.retriever.a": {"evidentia.reranker.b"}, "evidentia.reranker.b": {"evidentia.retriever.a"}}
    assert find_cycles(graph) == [["evidentia.reranker.b", "evidentia.retriever.a"]]
    assert layer_violations(graph) == ["evidentia.retriever.a (retriever) imports evidentia.reranker.b (reranker)"]


def test_no_test_module_imports_another():
    """Shared fixtures live in conftest.py and helpers in tests/utils, so every test
    module can be read, run and moved on its own."""
    tests = ROOT / "tests"
    offenders = []
    for path in sorted(tests.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                last = name.rpartition(".")[2]
                if last.startswith("test_") or last in ("conftest",):
                    offenders.append(f"{path.relative_to(tests)} imports {name}")
    assert offenders == []


def test_the_tests_mirror_the_source_tree():
    """A layer's tests live in the folder of its name (tests/reranker/ for reranker/),
    the top-level package's (evidentia/) at the root, the benchmarks' in tests/bench/:
    the test of a module is found where the module is."""
    tests = ROOT / "tests"
    folders = {path.parent.relative_to(tests).as_posix() for path in tests.rglob("test_*.py")}
    sources = {name for name in PACKAGES if name != "evidentia"} | {"bench"}
    assert folders - {"."} <= sources, f"test folders without a source folder: {sorted(folders - {'.'} - sources)}"
    for folder in folders - {"."}:
        assert (tests / folder / "__init__.py").exists(), f"tests/{folder} needs an __init__.py (unique module names)"


if __name__ == "__main__":  # pragma: no cover - `python tests/test_architecture.py` prints the findings
    g = import_graph()
    for c in find_cycles(g):
        print("cycle:", " <-> ".join(c))
    for v in layer_violations(g):
        print("layer:", v)
    pytest.main([__file__, "-q"])
