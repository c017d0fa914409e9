"""Model registry: every trained classifier is kept with its metadata, one of
them is in production, and promotion/rollback is one atomic file write.

Layout under ``<data_dir>/models``::

    registry.json        {"production": "v0003", "models": {...}, "events": [...]}
    v0001/ v0002/ ...    directories written by `evidentia train`

``registry.json`` is replaced with write-to-temp + fsync + rename, under an
exclusive lock, so a crash or a concurrent `evidentia retrain` never leaves it
half-written, and a reader (the API's hot reload) always sees a whole version.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from evidentia.runtime import make_private_dir
from evidentia.reranker.classifier_model import METADATA_FILE, SHIPPED_MODEL_DIR, ModelLoadError, ModelMetadata

# The layout is defined here, once: `evidentia train`/`retrain` write through
# ModelRegistry, the classifier reranker reads the production pointer.
MODELS_SUBDIR = "models"
REGISTRY_FILE = "registry.json"


def production_model_dir(data_dir: Path) -> Path | None:
    """The registry's production model, or None when none was promoted."""
    root = Path(data_dir) / MODELS_SUBDIR
    try:
        state = json.loads((root / REGISTRY_FILE).read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        # not the default model in silence: searches would use another model than the one promoted
        raise ModelLoadError(f"the model registry {root / REGISTRY_FILE} is unreadable ({exc}); restore it from a "
                             "backup, or move it away to use the default model") from None
    version = state.get("production")
    return root / version if version else None


def resolve_model_dir(settings) -> Path:
    """Which classifier to load: EVIDENTIA_CLASSIFIER_MODEL if set, else the
    registry's production model, else the model shipped with Evidentia. Called on
    every validation by the API, so a promotion takes effect without a restart."""
    if settings.classifier_model:
        return Path(settings.classifier_model)
    return production_model_dir(settings.data_dir) or SHIPPED_MODEL_DIR


def registry_for(data_dir: Path) -> "ModelRegistry":
    """The registry the classifier reranker reads (see classifier_model.resolve_model_dir)."""
    return ModelRegistry(Path(data_dir) / MODELS_SUBDIR)


class RegistryError(RuntimeError):
    """A registry operation that cannot be done; the message says why."""


@dataclass(frozen=True)
class ModelEntry:
    version: str
    path: Path
    base_model: str
    data_sha256: str
    created: str
    metrics: dict[str, Any] = field(default_factory=dict)
    promoted: bool = False  # ever promoted to production
    production: bool = False  # in production now
    note: str = ""
    # What it is now, from the events: "in production", "rolled back" (taken out of production
    # by a rollback), "replaced" (by the promotion of another), "never promoted"; "promoted"
    # where the history does not say what followed. `promoted` alone stays true after a rollback.
    status: str = "never promoted"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class ModelRegistry:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- storage -------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[dict]:
        """Read-modify-write of registry.json under an exclusive lock."""
        make_private_dir(self.root.parent)  # the data dir, when models are its first files
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self._read()
            yield state
            self._write(state)

    def _read(self) -> dict:
        try:
            return json.loads((self.root / REGISTRY_FILE).read_text())
        except FileNotFoundError:
            return {"production": None, "models": {}, "events": []}
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RegistryError(f"{self.root / REGISTRY_FILE} is unreadable ({exc}); restore it from a "
                                "backup, or move it away to use the default model") from None

    def _write(self, state: dict) -> None:
        tmp = self.root / f".{REGISTRY_FILE}.tmp"
        with open(tmp, "w") as fh:
            json.dump(state, fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.root / REGISTRY_FILE)

    # -- queries -------------------------------------------------------------
    def entries(self) -> list[ModelEntry]:
        state = self._read()
        return [self._entry(v, info, state) for v, info in sorted(state["models"].items())]

    def get(self, version: str) -> ModelEntry:
        state = self._read()
        if version not in state["models"]:
            raise RegistryError(f"unknown model version {version!r}; `evidentia models list` shows them")
        return self._entry(version, state["models"][version], state)

    def production(self) -> ModelEntry | None:
        state = self._read()
        version = state.get("production")
        return self._entry(version, state["models"][version], state) if version else None

    def events(self) -> list[dict]:
        return list(self._read().get("events", []))

    def _entry(self, version: str, info: dict, state: dict) -> ModelEntry:
        return ModelEntry(
            version=version,
            path=self.root / version,
            base_model=info.get("base_model", ""),
            data_sha256=info.get("data_sha256", ""),
            created=info.get("created", ""),
            metrics=info.get("metrics", {}),
            promoted=bool(info.get("promoted")),
            production=state.get("production") == version,
            note=info.get("note", ""),
            status=_status(version, bool(info.get("promoted")), state),
        )

    # -- changes -------------------------------------------------------------
    def register(self, model_dir: Path, metrics: dict[str, Any] | None = None, note: str = "") -> ModelEntry:
        """Move a directory written by `evidentia train` into the registry under the
        next version number. The move is a rename on the same file system."""
        model_dir = Path(model_dir)
        metadata = ModelMetadata.read(model_dir)  # refuses anything that is not a whole model
        with self._locked() as state:
            numbers = [int(v[1:]) for v in state["models"] if v[1:].isdigit()]
            version = f"v{(max(numbers) + 1) if numbers else 1:04d}"
            target = self.root / version
            if target.exists():  # left by a crash between rename and registry write
                shutil.rmtree(target)
            os.replace(model_dir, target) if _same_fs(model_dir, self.root) else shutil.move(str(model_dir), target)
            state["models"][version] = {
                "base_model": metadata.base_model,
                "data_sha256": metadata.extra.get("data_sha256", ""),
                "created": metadata.extra.get("created", _now()),
                "metrics": metrics if metrics is not None else metadata.metrics,
                "promoted": False,
                "note": note,
            }
            state["events"].append({"at": _now(), "event": "registered", "version": version, "note": note})
        return self.get(version)

    def promote(self, version: str, reason: str = "") -> ModelEntry:
        with self._locked() as state:
            if version not in state["models"]:
                raise RegistryError(f"unknown model version {version!r}")
            if not (self.root / version / METADATA_FILE).exists():
                raise RegistryError(f"model {version} has no files in {self.root / version}")
            previous = state.get("production")
            if previous == version:
                # nothing changes: an event "promoted v1 over v1" made rollback return to v1 for ever
                return self.get(version)
            state["production"] = version
            state["models"][version]["promoted"] = True
            state["events"].append({"at": _now(), "event": "promoted", "version": version,
                                    "previous": previous, "reason": reason})
        return self.get(version)

    def update_metrics(self, version: str, metrics: dict[str, Any]) -> ModelEntry:
        """Add evaluation results to a registered model's metadata."""
        with self._locked() as state:
            if version not in state["models"]:
                raise RegistryError(f"unknown model version {version!r}")
            state["models"][version].setdefault("metrics", {}).update(metrics)
        return self.get(version)

    def use_default(self, reason: str = "") -> None:
        """Take the production version out: the default model (EVIDENTIA_CLASSIFIER_MODEL or
        the shipped one) is used. A promotion of "no version", so rollback undoes it."""
        with self._locked() as state:
            previous = state.get("production")
            if previous is None:
                return
            state["production"] = None
            state["events"].append({"at": _now(), "event": "promoted", "version": None, "previous": previous,
                                    "reason": reason})

    def rollback(self) -> ModelEntry | None:
        """Back to the model that was in production before the current one was put there;
        each rollback goes one step further back, to the default model (None) at the end."""
        with self._locked() as state:
            current = state.get("production")
            history = production_history(state["events"])
            if history[-1] != current:
                # a registry.json edited by hand: the events do not lead to its production
                history = [None] + ([current] if current is not None else [])
            if len(history) < 2:
                raise RegistryError("no model is in production: nothing to roll back")
            previous = history[-2]
            state["production"] = previous
            state["events"].append({"at": _now(), "event": "rolled back", "version": previous, "from": current})
        return self.production()


def production_history(events: list[dict]) -> list[str | None]:
    """What was put in production, oldest first, as the events leave it: a promotion adds
    its version (None: the default model), a rollback takes the last one off. Rollback
    read "the version before the current one's last promotion", so after v1, v3, v1 it went
    v3, v1, v3, … for ever. A rollback event that disagrees (written by that rule) is
    followed to the version it names."""
    history: list[str | None] = [None]
    for event in events:
        if event["event"] == "promoted":
            if event["version"] != history[-1]:
                history.append(event["version"])
        elif event["event"] == "rolled back":
            target = event.get("version")
            if len(history) > 1:
                history.pop()
            if history[-1] != target:
                history = history[:history.index(target) + 1] if target in history else [*history, target]
    return history


def _status(version: str, promoted: bool, state: dict) -> str:
    """ModelEntry.status: the last event that put ``version`` in or out of production says it."""
    if state.get("production") == version:
        return "in production"
    if not promoted:
        return "never promoted"
    status = "promoted"
    for event in state.get("events", []):
        if event["event"] == "promoted" and event.get("previous") == version and event["version"] != version:
            status = "replaced"
        elif event["event"] == "rolled back" and event.get("from") == version:
            status = "rolled back"
        elif event["event"] in ("promoted", "rolled back") and event["version"] == version:
            status = "promoted"  # in production again (then replaced or rolled back, or the file is inconsistent)
    return status


def _same_fs(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except FileNotFoundError:
        return False
