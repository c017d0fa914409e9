"""Load a script of bench/ as a module, for the tests of bench/ (its scripts import their
siblings, so bench/ goes on the path)."""

import importlib.util
import sys
from types import ModuleType

from tests.utils.paths import REPO

BENCH = REPO / "bench"


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py, executed as module ``name``."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
