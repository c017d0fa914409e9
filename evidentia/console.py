"""What every command of the ``evidentia`` CLI shares: exit codes, the one-line
``error:`` message, and the engine opened from the environment. Command modules
(``evidentia.cli``, ``evaluation/cli.py``, ``training/cli.py``, ``api/cli.py``)
import this module; nothing here imports them, so the CLI has no import cycle."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import typer

from evidentia.config import ConfigError, Settings
from evidentia.engine import Engine, RunConfig, RunConfigError

EXIT_BAD_INPUT = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3

# How the CLI names each run option of Engine.config in its messages.
OPTION_FLAGS = {"stage": "--stage", "reranker": "--reranker", "threshold": "--threshold", "pool_size": "--top-k"}


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


class Context:
    """The engine of one CLI command, opened lazily so that `--help` needs no index;
    setting and backend errors become one `error:` line and an exit code."""

    def __init__(self) -> None:
        try:
            self.settings = Settings.from_env()
        except ConfigError as exc:
            raise fail(str(exc))
        self.engine = Engine(self.settings)

    @property
    def backend(self):
        from evidentia.retriever.base import BackendError

        try:
            return self.engine.backend
        except ConfigError as exc:
            raise fail(str(exc))
        except BackendError as exc:
            raise fail(str(exc), EXIT_BACKEND)

    @property
    def detector(self):
        return self.engine.detector

    @property
    def embedder(self):
        try:
            return self.engine.embedder
        except ConfigError as exc:
            raise fail(str(exc))

    def config(self, flags: dict[str, str] | None = None, **options) -> RunConfig:
        """Engine.config, with each problem named by the command's flag."""
        try:
            return self.engine.config(**options)
        except RunConfigError as exc:
            names = {**OPTION_FLAGS, **(flags or {})}
            raise fail("; ".join(f"{names.get(o, o)} {m}" for o, m in exc.problems))

    def index_missing(self, doc_ids: Sequence[str], folder: Path) -> None:
        """Index, from ``folder``, the documents the index lacks (commands that take
        labelled queries and a PDF folder); each bad PDF and a summary go to stderr."""
        self.backend  # noqa: B018 (opens it, or fails with the right exit code)
        summary = self.engine.index_missing(doc_ids, folder)
        if summary is not None:
            for failure in summary.failures:
                typer.echo(f"error: {failure.reason}", err=True)
            typer.echo(f"indexed from {folder}: {summary.line()}", err=True)
