"""What every command of the ``evidentia`` CLI shares: exit codes, the one-line
``error:`` message, and the engine opened from the environment. Command modules
(``evidentia.cli``, ``evaluation/cli.py``, ``training/cli.py``, ``api/cli.py``)
import this module; nothing here imports them, so the CLI has no import cycle."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable, Sequence

import typer
from typer.core import TyperCommand

from evidentia.config import ConfigError, Settings, environment_warnings
from evidentia.engine import Engine, RunConfig, RunConfigError
from evidentia.text import listed

EXIT_BAD_INPUT = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3
EXIT_FALLBACK = 4  # `search --strict`: the reranker fell back to the first-stage order

# How the CLI names each run option of Engine.config in its messages.
OPTION_FLAGS = {"stage": "--stage", "reranker": "--reranker", "threshold": "--threshold", "pool_size": "--top-k",
                "question": "--question", "answer": "--answer"}


class Command(TyperCommand):
    """A command whose arguments read as their values are named: `index [OPTIONS] PATHS...`
    and `PATHS...` under Arguments, where typer wrote `{paths}...` in the usage and
    `paths... <list[Path]>` in the help."""

    @staticmethod
    def _metavar(param) -> str:
        name = param.metavar or param.name.upper()
        name = name if param.required else f"[{name}]"
        return f"{name}..." if param.nargs != 1 else name

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            is_argument = param.param_type_name == "argument"
            pieces += [self._metavar(param)] if is_argument else param.get_usage_pieces(ctx)
        return pieces

    def format_options(self, ctx, formatter) -> None:
        arguments, options = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append((self._metavar(param), record[1]))
            else:
                options.append(record)
        for title, records in (("Arguments", arguments), ("Options", options)):
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


class App(typer.Typer):
    """A typer app of the CLI (the main one, `models`, `keys`): `-h` works as `--help`
    does, for the app and each command (a newcomer's first try, refused as "No such
    option: -h"), and each command is a Command. Plain help (rich_markup_mode None), so
    flags read as `--json`, not `--json <bool>`."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("context_settings", {"help_option_names": ["-h", "--help"]})
        kwargs.setdefault("rich_markup_mode", None)
        super().__init__(**kwargs)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs):
        return super().command(name, cls=cls or Command, **kwargs)


def quiet_libraries(verbose: bool = False) -> None:
    """Third-party progress bars ("Loading weights"), advisory messages and
    deprecation warnings are noise to a user of this program: off unless
    ``-v``. Environment variables, because the libraries read them when they
    are imported, which happens later and only when a command needs them."""
    if verbose:
        return
    for name, value in (("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TRANSFORMERS_VERBOSITY", "error"),
                        ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(name, value)
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def read_settings() -> Settings:
    """The settings from the environment, or one `error:` line (exit 2)."""
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise fail(str(exc))


def warn_about_environment() -> None:
    """A `warning:` line for each thing set in the environment without effect
    (config.environment_warnings), as a command starts (evidentia.cli's callback: once
    per command, though a command may read the settings twice). Settings that cannot
    be read are left to the command, which says so."""
    try:
        settings = Settings.from_env()
    except ConfigError:
        return
    for line in environment_warnings(settings):
        typer.echo(f"warning: {line}", err=True)


def require_files(*named: tuple[str, Path | None]) -> None:
    """Fail (exit 1) on the first (option, path) whose path is missing or a folder, worded
    as `eval` words it and before any work: the readers' OSError read "[Errno 2] No such
    file or directory: '...'"."""
    for name, path in named:
        if path is not None and not path.exists():
            raise fail(f"{name} {path}: no such file", EXIT_BAD_INPUT)
        if path is not None and path.is_dir():
            raise fail(f"{name} {path}: is a folder, not a JSONL file", EXIT_BAD_INPUT)


class Context:
    """The engine of one CLI command, opened lazily so that `--help` needs no index;
    setting and backend errors become one `error:` line and an exit code."""

    def __init__(self, batch: bool = False, **overrides) -> None:
        """The settings from the environment, with ``overrides`` (e.g. a data_dir).
        ``batch``: a command that only computes (index, embed, eval, dataset): its
        model uses every CPU unless EVIDENTIA_THREADS says otherwise."""
        self.settings = read_settings().with_(**overrides)
        if batch and self.settings.threads is None:
            from evidentia.runtime import batch_threads

            self.settings = self.settings.with_(threads=batch_threads())
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
        return self._configured("embedder")

    @property
    def ocr(self):
        return self._configured("ocr")

    def _configured(self, part: str):
        """The engine's ``part``, or one error line where its settings are wrong."""
        try:
            return getattr(self.engine, part)
        except ConfigError as exc:
            raise fail(str(exc))

    def config(self, flags: dict[str, str] | None = None, **options) -> RunConfig:
        """Engine.config, with each problem named by the command's flag."""
        try:
            return self.engine.config(**options)
        except RunConfigError as exc:
            raise self._fail(exc, flags)

    def check_text(self, question: str, answer: str) -> None:
        """The same limits on question and answer as the API's."""
        try:
            self.engine.check_text(question, answer)
        except RunConfigError as exc:
            raise self._fail(exc)

    @staticmethod
    def _fail(exc: RunConfigError, flags: dict[str, str] | None = None) -> typer.Exit:
        names = {**OPTION_FLAGS, **(flags or {})}
        return fail("; ".join(f"{names.get(o, o)} {m}" for o, m in exc.problems))

    def require_documents(self, doc_ids: Sequence[str], folders: Sequence[Path],
                          missing_message: Callable[[list[str]], str]) -> None:
        """Commands that take labelled queries: open the index, index the queries'
        documents it lacks from ``folders``, and fail (exit 1) with
        ``missing_message(ids)`` when some are still missing."""
        self.backend  # noqa: B018 (opens it, or fails with the right exit code)
        for folder in folders:
            self.index_missing(doc_ids, folder)
        missing = self.engine.missing_documents(doc_ids)
        if missing:
            raise fail(missing_message(missing) + self._in_other_tenants(missing), EXIT_BAD_INPUT)

    def _in_other_tenants(self, missing: Sequence[str]) -> str:
        """Labelled queries name the default tenant's documents: say so where the missing
        ones were uploaded by another tenant (its API key), else nothing."""
        from evidentia.library import Library

        library = Library(self.engine)
        try:
            _, elsewhere = library.elsewhere(None, missing)
        finally:
            library.close()
        if not elsewhere:
            return ""
        shown = listed(elsewhere, 5)
        return (f" ({shown}: another tenant's upload; labelled queries read the documents of the tenant 'default', so "
                "index those PDFs for it too)")

    def index_missing(self, doc_ids: Sequence[str], folder: Path) -> None:
        """Index, from ``folder``, the documents the index lacks (commands that take
        labelled queries and a PDF folder), as the default tenant's (its API key sees
        them); each bad PDF and a summary go to stderr."""
        from evidentia.library import Library

        self.backend  # noqa: B018 (opens it, or fails with the right exit code)
        library = Library(self.engine)
        try:
            summary = library.index_missing(doc_ids, folder)
        except ConfigError as exc:  # a bad EVIDENTIA_OCR_LANGUAGES, said when a document is to be indexed
            raise fail(str(exc))
        finally:
            library.close()
        if summary is not None:
            for failure in summary.failures:
                typer.echo(f"error: {failure.reason}", err=True)
            typer.echo(f"indexed from {folder}: {summary.line()}", err=True)
