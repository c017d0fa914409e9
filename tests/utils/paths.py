"""Where the repository and the shared data beside it are, for test modules at any depth."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# ../shared/data beside the repository (CI has it; tests that need it skip without it)
SHARED_DATA = REPO.parent / "shared" / "data"
