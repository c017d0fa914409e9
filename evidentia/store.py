"""The API's durable state: tenants, API keys, documents, validations, feedback.

SQLite in WAL mode with ``synchronous=FULL``: once a write method returns, the
row is in the write-ahead log on disk and survives a crash of the process or of
the machine, so an acknowledged request (201, 202) is never lost. One
connection per store, guarded by a lock: every statement is short, and the
heavy work (PDF parsing, search, reranking) happens outside it.

API keys are never stored in clear: a key reads ``evk_<key_id>_<secret>``; the
store keeps the key id, a random per-key salt and ``sha256(salt + secret)``,
and checks a presented key in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import sqlite3
import threading
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any, Iterable, Iterator, Sequence

from evidentia.runtime import make_private_dir
from evidentia.text import normalise_numbers

SCHEMA_VERSION = 4  # 2: documents.ocr; 3: attempts and next_* (re-index while serving); 4: validations.generations
# Columns added after version 1 (ALTER TABLE on open; a version-1 store is upgraded in place).
# attempts: starts of the current upload's indexing (bounded: a file that kills the server is not
# retried forever); next_*: a re-upload of a ready document, indexed while the ready version is served.
ADDED_DOCUMENT_COLUMNS = {
    "ocr": "TEXT NOT NULL DEFAULT '{}'",  # version 2: pages OCR'd / left unread
    "attempts": "INTEGER NOT NULL DEFAULT 0",
    "next_generation": "TEXT",
    "next_file_path": "TEXT",
    "next_filename": "TEXT",
    "next_size_bytes": "INTEGER",
    "next_status": "TEXT",
    "next_reason": "TEXT",
}

# Columns added to validations after version 3. generations: {document_id: generation} of the
# documents a validation searched, so that feedback on it is refused once one of them is re-indexed
# (its page text is then another file's). NULL on a validation written before version 4.
ADDED_VALIDATION_COLUMNS = {"generations": "TEXT"}

# Verdicts kept per page of one validation (distinct analysts). Each verdict copies the page's text
# (up to ~100 KB) so that the export survives a re-upload; unbounded, 3000 analyst names on one page
# grew the store by 273 MB. A page of one search reviewed by more than this many people is a flood,
# not review. A constant: Settings has no per-request storage limits to sit beside.
MAX_VERDICTS_PER_PAGE = 20
# Pages of a validation's documents that it did not return, judged in it at most: an
# analyst reading on finds a few; a verdict stores its page's text (up to 100,000
# characters), and every page of 20 documents of 2,000 pages was within reach.
MAX_PAGES_BEYOND_RESULTS = 100

# \Z, not $: "$" also matches before a final newline, and "evil\n" passed as an id (an
# HTTP Location header cannot hold it; the upload was stored and never answered)
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
DOCUMENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")


# Latin letters that NFKD does not take to ASCII, written as people write them without
# the letter: `Größe` was `Groe`, and `Søren` and `Sren` shared an id
_TRANSLITERATED = str.maketrans({"ß": "ss", "ẞ": "SS", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O",
                                 "ł": "l", "Ł": "L", "đ": "d", "Đ": "D", "ð": "d", "Ð": "D", "þ": "th", "Þ": "Th",
                                 "ı": "i", "ħ": "h", "Ħ": "H"})


def document_id_for(filename: str) -> str:
    """A file's document id, the same for the CLI and the API: its stem with accents
    dropped (``é`` -> ``e``; ``ß``, ``æ``, ``ø``, ``œ``, ``ł`` written ``ss``, ``ae``,
    ``o``, ``oe``, ``l``), every run of characters other than ASCII letters, digits,
    ``_``, ``.``, ``-`` turned into one ``-``. A stem that loses letters, digits or
    symbols without an ASCII form (Cyrillic, Greek, CJK, emoji) gets ``-`` and 8 hex digits of its
    name's hash (``Отчёт_2023.pdf`` is ``2023-`` and those digits; ``文档.pdf``,
    with nothing left, ``document-`` and them); one longer than an id's 128
    characters keeps its first 119 and ``-`` and those 8 digits. Either way two files
    never share an id, which would make the second replace the first."""
    stem = PurePath(filename).stem
    digest = hashlib.sha256(stem.encode("utf-8")).hexdigest()[:8]
    decomposed = unicodedata.normalize("NFKD", stem.translate(_TRANSLITERATED))
    plain = decomposed.encode("ascii", "ignore").decode("ascii")
    # an accent is a combining mark (category M) after NFKD: dropping it loses nothing that tells names apart;
    # a letter, a digit or a symbol does ("report 🌱" and "report 🌍" were both "report")
    lost = any(not ch.isascii() and unicodedata.category(ch)[0] in "LNS" for ch in decomposed)
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", plain).strip("-._")
    if cleaned and (lost or len(cleaned) > 128):
        cleaned = f"{cleaned[:119].rstrip('-._')}-{digest}"
    return cleaned or f"document-{digest}"


def closest_document_id(name: str, document_ids: Iterable[str]) -> str | None:
    """Of ``document_ids``, the one a mistyped ``name`` most likely means: the closest in
    any case (``3M_2018_10k`` for ``3M_2018_10K``, ``AMCOR_2023Q4_10K`` for
    ``AMCOR_2023Q4_10Q``), ``name`` read as the id a file of that name gets; None when
    none is close. One rule for every command that suggests an id: `eval`'s file of a
    query's document (indexing.likely_pdf), `search`'s and `page`'s indexed document."""
    import difflib

    as_id = document_id_for(f"{name}.pdf")  # the suffix keeps a dot in the id ("report.v2")
    folded = {d.casefold(): d for d in document_ids}
    close = difflib.get_close_matches(as_id.casefold(), list(folded), n=1, cutoff=0.8)
    return folded[close[0]] if close else None


def _wording(text: str) -> str:
    """A question's or answer's words as search reads them: "12,450 tCO2e" and "12450 tco2e"
    are asked alike (earlier_verdicts)."""
    return " ".join(normalise_numbers(text).casefold().split())


KEY_PREFIX = "evk_"

STATUSES = ("queued", "indexing", "ready", "failed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY,
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL REFERENCES tenants(name),
    salt TEXT NOT NULL,
    key_hash TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS documents (
    tenant TEXT NOT NULL REFERENCES tenants(name),
    document_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('queued', 'indexing', 'ready', 'failed')),
    reason TEXT,
    pages INTEGER,
    empty_pages INTEGER,
    languages TEXT NOT NULL DEFAULT '{}',
    ocr TEXT NOT NULL DEFAULT '{}',
    filename TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    file_path TEXT NOT NULL,
    generation TEXT NOT NULL,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    PRIMARY KEY (tenant, document_id)
);
CREATE TABLE IF NOT EXISTS validations (
    validation_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL REFERENCES tenants(name),
    question TEXT NOT NULL,
    answer TEXT NOT NULL,
    document_ids TEXT NOT NULL,
    reranker TEXT NOT NULL,
    threshold REAL,
    top_k INTEGER NOT NULL,
    pages TEXT NOT NULL,
    model_version TEXT,
    fallback_reason TEXT,
    created TEXT NOT NULL,
    generations TEXT
);
CREATE INDEX IF NOT EXISTS validations_tenant ON validations (tenant, created);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    validation_id TEXT NOT NULL REFERENCES validations(validation_id),
    tenant TEXT NOT NULL REFERENCES tenants(name),
    document_id TEXT NOT NULL,
    page INTEGER NOT NULL,
    relevant INTEGER NOT NULL CHECK (relevant IN (0, 1)),
    analyst TEXT NOT NULL DEFAULT '',
    page_text TEXT NOT NULL,
    created TEXT NOT NULL,
    UNIQUE (validation_id, document_id, page, analyst)
);
CREATE INDEX IF NOT EXISTS feedback_tenant ON feedback (tenant, id);
CREATE INDEX IF NOT EXISTS feedback_page ON feedback (tenant, document_id, page);
"""


def store_path(data_dir: Path) -> Path:
    """The SQLite store of tenants, keys, documents, validations and feedback."""
    return Path(data_dir) / "api.sqlite3"


UPLOADS_FOLDER = "uploads"


def uploads_dir(data_dir: Path) -> Path:
    """Where uploaded PDFs are kept, one folder per tenant."""
    return Path(data_dir) / UPLOADS_FOLDER


class StoreError(RuntimeError):
    """The store cannot be opened or has another schema version."""


class FeedbackRefused(Exception):
    """A verdict the store will not keep: ``code`` says why (document_gone,
    document_changed, too_many_verdicts, too_many_pages, validation_not_found)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def hash_secret(salt: str, secret: str) -> str:
    return hashlib.sha256((salt + secret).encode("utf-8")).hexdigest()


def split_key(key: str) -> tuple[str, str] | None:
    """``evk_<key_id>_<secret>`` -> (key_id, secret), or None for anything else."""
    if not key.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = key[len(KEY_PREFIX):].partition("_")
    if not sep or not key_id or not secret:
        return None
    return key_id, secret


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    tenant: str
    created: str


@dataclass(frozen=True)
class NewKey:
    key: str  # shown once, never stored
    info: ApiKey


@dataclass(frozen=True)
class DocumentRow:
    tenant: str
    document_id: str
    status: str
    reason: str | None
    pages: int | None
    empty_pages: int | None
    languages: dict[str, int]
    filename: str
    size_bytes: int
    file_path: str
    generation: str
    created: str
    updated: str
    # {"ocr_pages": n, "unread_pages": n, "ocr_confidence": x}; {} before indexing
    ocr: dict = field(default_factory=dict)
    attempts: int = 0
    # a re-upload being indexed while this (ready) version is served; see put_document
    next_generation: str | None = None
    next_file_path: str | None = None
    next_filename: str | None = None
    next_size_bytes: int | None = None
    next_status: str | None = None  # queued, indexing, failed
    next_reason: str | None = None

    def version(self, generation: str) -> str | None:
        """'current' when ``generation`` is this row's own upload still to index,
        'next' when it is its pending re-upload, None when it is neither (stale)."""
        if generation == self.generation and self.status in ("queued", "indexing"):
            return "current"
        if generation == self.next_generation and self.next_status in ("queued", "indexing"):
            return "next"
        return None


@dataclass(frozen=True)
class ValidationRow:
    validation_id: str
    tenant: str
    question: str
    answer: str
    document_ids: list[str]
    reranker: str
    threshold: float | None
    top_k: int
    pages: list[dict[str, Any]]
    model_version: str | None
    fallback_reason: str | None
    created: str
    # {document_id: generation} searched; None: add_validation records the documents' current ones
    # (and a validation stored before schema version 4 has none)
    generations: dict[str, str] | None = None


@dataclass(frozen=True)
class FeedbackRow:
    id: int
    validation_id: str
    document_id: str
    page: int
    relevant: bool
    analyst: str
    page_text: str
    created: str
    question: str = ""
    answer: str = ""


@dataclass
class Store:
    path: Path
    _conn: sqlite3.Connection = field(init=False, repr=False)
    _lock: threading.RLock = field(init=False, repr=False, default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        make_private_dir(self.path.parent)  # the data dir
        try:
            # autocommit mode: transactions are explicit (BEGIN IMMEDIATE ... COMMIT)
            self._conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None,
                                         timeout=10.0)
            self._conn.row_factory = sqlite3.Row
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch the store to WAL mode (got {mode})")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._conn.execute("PRAGMA busy_timeout=10000")
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, 1, 2, 3, SCHEMA_VERSION):
                raise StoreError(f"{self.path} has schema version {version}, this Evidentia needs "
                                 f"{SCHEMA_VERSION}")
            # CREATE ... IF NOT EXISTS: idempotent, so a crash half-way is redone next start
            self._conn.executescript(_SCHEMA)
            for table, added in (("documents", ADDED_DOCUMENT_COLUMNS), ("validations", ADDED_VALIDATION_COLUMNS)):
                have = {r[1] for r in self._conn.execute(f"PRAGMA table_info({table})").fetchall()}
                for column, decl in added.items():
                    if column not in have:
                        self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            if 0 < version < 4:
                # feedback a delete raced past before version 4 (post_feedback inserted after the
                # delete's transaction): it holds a deleted document's page text, which a delete
                # promises to remove. One statement: atomic, and redone if the version is not yet set.
                self._conn.execute("DELETE FROM feedback WHERE NOT EXISTS (SELECT 1 FROM documents d "
                                   "WHERE d.tenant = feedback.tenant AND d.document_id = feedback.document_id)")
            self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {self.path}: {exc}") from None

    # -- plumbing ------------------------------------------------------------
    class _Tx:
        def __init__(self, store: "Store") -> None:
            self.store = store

        def __enter__(self) -> sqlite3.Connection:
            self.store._lock.acquire()
            try:
                self.store._conn.execute("BEGIN IMMEDIATE")
            except BaseException:
                self.store._lock.release()
                raise
            return self.store._conn

        def __exit__(self, exc_type, exc, tb) -> None:
            try:
                if exc_type is None:
                    self.store._conn.execute("COMMIT")
                else:
                    self.store._conn.execute("ROLLBACK")
            finally:
                self.store._lock.release()

    def _tx(self) -> "Store._Tx":
        """One write transaction; committed (and fsynced) when the block ends."""
        return Store._Tx(self)

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def ping(self) -> None:
        self._query("SELECT 1")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- tenants and keys ----------------------------------------------------
    def create_key(self, tenant: str) -> NewKey:
        if not TENANT_RE.match(tenant):
            raise ValueError(f"tenant {tenant!r}: use 1-64 letters, digits, '.', '_' or '-', "
                             f"starting with a letter or digit")
        key_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_hex(16)
        created = now()
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO tenants (name, created) VALUES (?, ?)", (tenant, created))
            c.execute("INSERT INTO api_keys (key_id, tenant, salt, key_hash, created) VALUES (?, ?, ?, ?, ?)",
                      (key_id, tenant, salt, hash_secret(salt, secret), created))
        return NewKey(key=f"{KEY_PREFIX}{key_id}_{secret}", info=ApiKey(key_id, tenant, created))

    def authenticate(self, key: str) -> ApiKey | None:
        parts = split_key(key)
        if parts is None:
            return None
        key_id, secret = parts
        rows = self._query("SELECT key_id, tenant, salt, key_hash, created FROM api_keys WHERE key_id = ?", (key_id,))
        if not rows:
            return None
        row = rows[0]
        if not hmac.compare_digest(hash_secret(row["salt"], secret), row["key_hash"]):
            return None
        return ApiKey(row["key_id"], row["tenant"], row["created"])

    def list_keys(self) -> list[ApiKey]:
        rows = self._query("SELECT key_id, tenant, created FROM api_keys ORDER BY created, key_id")
        return [ApiKey(r["key_id"], r["tenant"], r["created"]) for r in rows]

    def delete_key(self, key_id: str) -> bool:
        with self._tx() as c:
            return c.execute("DELETE FROM api_keys WHERE key_id = ?", (key_id,)).rowcount > 0

    def add_tenant(self, tenant: str) -> None:
        """Make ``tenant`` known (a key creates its tenant; so does `evidentia index --tenant`)."""
        if not TENANT_RE.match(tenant):
            raise StoreError(f"invalid tenant {tenant!r}")
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO tenants (name, created) VALUES (?, ?)", (tenant, now()))

    def tenants(self) -> list[str]:
        return [r["name"] for r in self._query("SELECT name FROM tenants ORDER BY name")]

    # -- documents -----------------------------------------------------------
    # An upload's file is stored relative to the data dir (the store's folder), and read
    # back under the data dir the store is opened in. Absolute paths (rows written before)
    # pointed into the data dir they were written in: a copy of it (a backup restored
    # elsewhere) served the original's files, its start-up sweep removed its own as
    # orphans, and a delete on the copy removed the original's file.
    def _stored_path(self, path: str | None) -> str | None:
        if not path:
            return path
        for inside, data_dir in ((Path(path), self.path.parent), (Path(path).resolve(), self.path.parent.resolve())):
            try:  # as given first: an uploads folder that is a link elsewhere resolves out of the data dir
                return inside.relative_to(data_dir).as_posix()
            except ValueError:
                pass
        return str(path)  # outside the data dir: kept as given

    def _file_path(self, stored: str | None) -> str | None:
        if not stored:
            return stored
        path = Path(stored)
        if not path.is_absolute():
            return str(self.path.parent / path)
        parts = path.parts
        if len(parts) >= 4 and parts[-4] == UPLOADS_FOLDER:
            # a row written with absolute paths (uploads/<tenant>/<generation>/<file>, the layout of
            # api/routers/documents.py and library.py): its place in this data dir. By position:
            # a tenant may be named "uploads" too
            return str(self.path.parent.joinpath(UPLOADS_FOLDER, *parts[-3:]))
        return stored

    def _document(self, row: sqlite3.Row) -> DocumentRow:
        return DocumentRow(
            tenant=row["tenant"], document_id=row["document_id"], status=row["status"], reason=row["reason"],
            pages=row["pages"], empty_pages=row["empty_pages"], languages=json.loads(row["languages"] or "{}"),
            ocr=json.loads(row["ocr"] or "{}"), filename=row["filename"], size_bytes=row["size_bytes"],
            file_path=self._file_path(row["file_path"]),
            generation=row["generation"], created=row["created"], updated=row["updated"],
            attempts=row["attempts"], next_generation=row["next_generation"],
            next_file_path=self._file_path(row["next_file_path"]),
            next_filename=row["next_filename"], next_size_bytes=row["next_size_bytes"],
            next_status=row["next_status"], next_reason=row["next_reason"],
        )

    def put_document(self, tenant: str, document_id: str, filename: str, size_bytes: int, file_path: str,
                     generation: str, replace_ready: bool = False) -> tuple[DocumentRow, list[tuple[str, str]]]:
        """Insert a queued document, or replace an earlier upload of the same id.
        A ``ready`` document is not replaced at once: the upload becomes its
        ``next_*`` version, indexed while the ready one is served, and swapped in
        when it is ready (``promote_next``); ``replace_ready`` replaces it at once
        (the CLI, which has already indexed the file). Returns (the row, the superseded
        uploads as (generation, file_path): their indexing is to be cancelled and
        their files removed; never the version being served)."""
        ts = now()
        superseded: list[tuple[str, str]] = []
        file_path = self._stored_path(file_path)
        with self._tx() as c:
            old = c.execute("SELECT * FROM documents WHERE tenant = ? AND document_id = ?",
                            (tenant, document_id)).fetchone()
            old_row = self._document(old) if old else None
            if old_row is not None and old_row.next_generation and old_row.next_file_path:
                superseded.append((old_row.next_generation, old_row.next_file_path))
            if old_row is not None and old_row.status == "ready" and not replace_ready:
                c.execute(
                    "UPDATE documents SET next_generation = ?, next_file_path = ?, next_filename = ?, "
                    "next_size_bytes = ?, next_status = 'queued', next_reason = NULL, attempts = 0, updated = ? "
                    "WHERE tenant = ? AND document_id = ?",
                    (generation, file_path, filename, size_bytes, ts, tenant, document_id))
            else:
                if old_row is not None:
                    superseded.append((old_row.generation, old_row.file_path))
                c.execute(
                    "INSERT INTO documents (tenant, document_id, status, reason, pages, empty_pages, languages, "
                    "filename, size_bytes, file_path, generation, created, updated) "
                    "VALUES (?, ?, 'queued', NULL, NULL, NULL, '{}', ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (tenant, document_id) DO UPDATE SET status = 'queued', reason = NULL, pages = NULL, "
                    "empty_pages = NULL, languages = '{}', ocr = '{}', filename = excluded.filename, "
                    "size_bytes = excluded.size_bytes, file_path = excluded.file_path, "
                    "generation = excluded.generation, updated = excluded.updated, attempts = 0, "
                    "next_generation = NULL, next_file_path = NULL, next_filename = NULL, next_size_bytes = NULL, "
                    "next_status = NULL, next_reason = NULL",
                    (tenant, document_id, filename, size_bytes, file_path, generation, ts, ts),
                )
            new = c.execute("SELECT * FROM documents WHERE tenant = ? AND document_id = ?",
                            (tenant, document_id)).fetchone()
        return self._document(new), superseded

    def begin_indexing(self, tenant: str, document_id: str, generation: str) -> int | None:
        """Mark the upload ``generation`` (the document's own or its next version)
        as indexing and count the attempt. Returns the attempt number (1 for the
        first), or None when the upload is stale (deleted, replaced, finished)."""
        with self._tx() as c:
            row = c.execute("SELECT * FROM documents WHERE tenant = ? AND document_id = ?",
                            (tenant, document_id)).fetchone()
            if row is None:
                return None
            which = self._document(row).version(generation)
            if which is None:
                return None
            column = "status" if which == "current" else "next_status"
            c.execute(f"UPDATE documents SET {column} = 'indexing', attempts = attempts + 1, updated = ? "
                      f"WHERE tenant = ? AND document_id = ?", (now(), tenant, document_id))
            return row["attempts"] + 1

    def fail_next(self, tenant: str, document_id: str, generation: str, reason: str) -> bool:
        """The re-upload ``generation`` failed: the served version stays, the
        document reports the reason (``next_status`` failed)."""
        with self._tx() as c:
            return c.execute(
                "UPDATE documents SET next_status = 'failed', next_reason = ?, next_file_path = NULL, updated = ? "
                "WHERE tenant = ? AND document_id = ? AND next_generation = ?",
                (reason, now(), tenant, document_id, generation)).rowcount > 0

    def promote_next(self, tenant: str, document_id: str, generation: str, pages: int, empty_pages: int,
                     languages: dict[str, int], ocr: dict | None = None) -> DocumentRow | None:
        """The re-upload ``generation`` is indexed: it becomes the served version.
        Returns the row as it was before (its file is now unreferenced), or None
        when the re-upload is stale."""
        with self._tx() as c:
            old = c.execute("SELECT * FROM documents WHERE tenant = ? AND document_id = ? AND next_generation = ?",
                            (tenant, document_id, generation)).fetchone()
            if old is None:
                return None
            c.execute(
                "UPDATE documents SET status = 'ready', reason = NULL, pages = ?, empty_pages = ?, languages = ?, ocr = ?, "
                "filename = next_filename, size_bytes = next_size_bytes, file_path = next_file_path, "
                "generation = next_generation, attempts = 0, next_generation = NULL, next_file_path = NULL, "
                "next_filename = NULL, next_size_bytes = NULL, next_status = NULL, next_reason = NULL, updated = ? "
                "WHERE tenant = ? AND document_id = ?",
                (pages, empty_pages, json.dumps(languages or {}), json.dumps(ocr or {}), now(), tenant, document_id))
        return self._document(old)

    def get_document(self, tenant: str, document_id: str) -> DocumentRow | None:
        rows = self._query("SELECT * FROM documents WHERE tenant = ? AND document_id = ?", (tenant, document_id))
        return self._document(rows[0]) if rows else None

    def get_documents(self, tenant: str, document_ids: Sequence[str]) -> dict[str, DocumentRow]:
        if not document_ids:
            return {}
        marks = ",".join("?" * len(document_ids))
        rows = self._query(f"SELECT * FROM documents WHERE tenant = ? AND document_id IN ({marks})",
                           (tenant, *document_ids))
        return {r["document_id"]: self._document(r) for r in rows}

    def list_documents(self, tenant: str) -> list[DocumentRow]:
        rows = self._query("SELECT * FROM documents WHERE tenant = ? ORDER BY document_id", (tenant,))
        return [self._document(r) for r in rows]

    def all_documents(self) -> list[DocumentRow]:
        return [self._document(r) for r in self._query("SELECT * FROM documents ORDER BY tenant, document_id")]

    def pending_documents(self) -> list[DocumentRow]:
        """Documents a crash may have left queued or half-way through indexing, oldest first."""
        rows = self._query("SELECT * FROM documents WHERE status IN ('queued', 'indexing') "
                           "OR next_status IN ('queued', 'indexing') ORDER BY updated")
        return [self._document(r) for r in rows]

    def set_status(self, tenant: str, document_id: str, generation: str, status: str, reason: str | None = None,
                   pages: int | None = None, empty_pages: int | None = None,
                   languages: dict[str, int] | None = None, ocr: dict | None = None) -> bool:
        """Update a document's status, only if it is still the upload ``generation``
        (a newer upload or a delete wins). False when it no longer is."""
        assert status in STATUSES
        with self._tx() as c:
            cur = c.execute(
                "UPDATE documents SET status = ?, reason = ?, pages = ?, empty_pages = ?, languages = ?, ocr = ?, "
                "updated = ? WHERE tenant = ? AND document_id = ? AND generation = ?",
                (status, reason, pages, empty_pages, json.dumps(languages or {}), json.dumps(ocr or {}), now(),
                 tenant, document_id, generation),
            )
            return cur.rowcount > 0

    def delete_document(self, tenant: str, document_id: str) -> DocumentRow | None:
        """Remove the document and the feedback given on its pages (feedback rows hold
        page text, which is the document's content). Returns the removed row."""
        with self._tx() as c:
            row = c.execute("SELECT * FROM documents WHERE tenant = ? AND document_id = ?",
                            (tenant, document_id)).fetchone()
            if row is None:
                return None
            c.execute("DELETE FROM feedback WHERE tenant = ? AND document_id = ?", (tenant, document_id))
            c.execute("DELETE FROM documents WHERE tenant = ? AND document_id = ?", (tenant, document_id))
        return self._document(row)

    # -- validations ---------------------------------------------------------
    def add_validation(self, v: ValidationRow) -> None:
        """Store a validation with the generation of each document it searched: feedback on
        it is refused once a document is re-indexed (add_feedback)."""
        with self._tx() as c:
            generations = v.generations
            if generations is None:
                # read right after the search; a re-upload promoted in the milliseconds between
                # the two is not seen (the caller may pass the generations it searched instead)
                marks = ",".join("?" * len(v.document_ids))
                rows = c.execute(f"SELECT document_id, generation FROM documents WHERE tenant = ? "
                                 f"AND document_id IN ({marks})", (v.tenant, *v.document_ids)).fetchall()
                generations = {r["document_id"]: r["generation"] for r in rows}
            c.execute(
                "INSERT INTO validations (validation_id, tenant, question, answer, document_ids, reranker, threshold, "
                "top_k, pages, model_version, fallback_reason, created, generations) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (v.validation_id, v.tenant, v.question, v.answer, json.dumps(v.document_ids), v.reranker, v.threshold,
                 v.top_k, json.dumps(v.pages), v.model_version, v.fallback_reason, v.created,
                 json.dumps(generations)),
            )

    def get_validation(self, tenant: str, validation_id: str) -> ValidationRow | None:
        rows = self._query("SELECT * FROM validations WHERE tenant = ? AND validation_id = ?", (tenant, validation_id))
        if not rows:
            return None
        r = rows[0]
        return ValidationRow(
            validation_id=r["validation_id"], tenant=r["tenant"], question=r["question"], answer=r["answer"],
            document_ids=json.loads(r["document_ids"]), reranker=r["reranker"], threshold=r["threshold"],
            top_k=r["top_k"], pages=json.loads(r["pages"]), model_version=r["model_version"],
            fallback_reason=r["fallback_reason"], created=r["created"],
            generations=json.loads(r["generations"]) if r["generations"] is not None else None,
        )

    def count_validations(self, tenant: str | None = None) -> int:
        if tenant is None:
            return self._query("SELECT COUNT(*) FROM validations")[0][0]
        return self._query("SELECT COUNT(*) FROM validations WHERE tenant = ?", (tenant,))[0][0]

    # -- feedback ------------------------------------------------------------
    def add_feedback(self, tenant: str, validation_id: str, document_id: str, page: int, relevant: bool,
                     analyst: str, page_text: str, generation: str) -> FeedbackRow:
        """One judgement per (validation, page, analyst): a second one replaces the first
        and, stored as a new row, moves to the end of the export (its order is the order of
        the verdicts' last updates, which the tie rule of retraining reads).
        ``page_text`` is the page as read from the document's upload ``generation``.
        Raises FeedbackRefused, checked in the insert's own transaction so that a delete or
        a re-index cannot come in between: document_gone when the document was deleted (a
        delete removes its feedback in one transaction: a verdict inserted after it would
        outlive it), document_changed when it is no longer the upload the validation
        searched, or the text was read from another one, too_many_verdicts past
        MAX_VERDICTS_PER_PAGE analysts on the page, too_many_pages past
        MAX_PAGES_BEYOND_RESULTS pages the validation did not return."""
        with self._tx() as c:
            doc = c.execute("SELECT generation, updated FROM documents WHERE tenant = ? AND document_id = ?",
                            (tenant, document_id)).fetchone()
            if doc is None:
                raise FeedbackRefused("document_gone", f"document {document_id} was deleted since the validation")
            v = c.execute("SELECT generations, created, pages FROM validations WHERE tenant = ? AND validation_id = ?",
                          (tenant, validation_id)).fetchone()
            if v is None:
                raise FeedbackRefused("validation_not_found", f"no validation {validation_id!r}")
            if v["generations"] is not None:
                searched = json.loads(v["generations"]).get(document_id)
                changed = searched != doc["generation"]
            else:
                # written before schema version 4: accepted only when nothing touched the
                # document since the validation (then it is the same upload for sure)
                changed = doc["updated"] > v["created"]
            if changed or generation != doc["generation"]:
                raise FeedbackRefused("document_changed", f"document {document_id} was uploaded again and "
                                      f"re-indexed since validation {validation_id}: its pages are another file's; "
                                      f"validate again and give feedback on that validation")
            old = c.execute("SELECT id FROM feedback WHERE validation_id = ? AND document_id = ? AND page = ? "
                            "AND analyst = ?", (validation_id, document_id, page, analyst)).fetchone()
            if old is not None:
                c.execute("DELETE FROM feedback WHERE id = ?", (old["id"],))
            else:
                count = c.execute("SELECT COUNT(*) FROM feedback WHERE validation_id = ? AND document_id = ? "
                                  "AND page = ?", (validation_id, document_id, page)).fetchone()[0]
                if count >= MAX_VERDICTS_PER_PAGE:
                    raise FeedbackRefused("too_many_verdicts", f"page {page} of {document_id} already has verdicts "
                                          f"from {count} analysts in validation {validation_id}, the most kept; "
                                          f"an analyst who gave one may still change it")
                returned = {(r["document_id"], r["page"]) for r in json.loads(v["pages"])}
                if count == 0 and (document_id, page) not in returned:
                    judged = {(r["document_id"], r["page"]) for r in c.execute(
                        "SELECT DISTINCT document_id, page FROM feedback WHERE validation_id = ?", (validation_id,))}
                    if len(judged - returned) >= MAX_PAGES_BEYOND_RESULTS:
                        raise FeedbackRefused("too_many_pages", f"validation {validation_id} already has verdicts on "
                                              f"{MAX_PAGES_BEYOND_RESULTS} pages it did not return, the most kept; "
                                              "validate again with the question's words for those pages")
            # the time is taken under the lock: verdicts' times follow their order (ids)
            ts = now()
            cur = c.execute(
                "INSERT INTO feedback (validation_id, tenant, document_id, page, relevant, analyst, page_text, "
                "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (validation_id, tenant, document_id, page, int(relevant), analyst, page_text, ts),
            )
            row = c.execute("SELECT * FROM feedback WHERE id = ?", (cur.lastrowid,)).fetchone()
        return FeedbackRow(row["id"], row["validation_id"], row["document_id"], row["page"], bool(row["relevant"]),
                           row["analyst"], row["page_text"], row["created"])

    def earlier_verdicts(self, tenant: str, question: str, answer: str, pages: Sequence[tuple[str, int, str]],
                         per_page: int = 5) -> dict[tuple[str, int], list[FeedbackRow]]:
        """Verdicts given in earlier validations on these (document, page, text)s for the
        same question and answer (as search reads them: case, spacing and the writing of
        figures aside), on that very text (the rule `evidentia retrain` applies: a document
        uploaded again with the same file keeps them, with another file loses them): each
        analyst's latest, latest first, at most ``per_page``."""
        texts = {(d, n): text for d, n, text in pages}
        docs = sorted({d for d, _ in texts})
        if not docs:
            return {}
        numbers = sorted({n for _, n in texts})
        # the (tenant, document_id, page) index narrows it to the pages shown, before the join
        rows = self._query(
            "SELECT f.*, v.question, v.answer FROM feedback f JOIN validations v USING (validation_id) "
            f"WHERE f.tenant = ? AND f.document_id IN ({', '.join('?' * len(docs))}) "
            f"AND f.page IN ({', '.join('?' * len(numbers))})", (tenant, *docs, *numbers))
        rows.sort(key=lambda r: -r["id"])  # latest first (an ORDER BY id took the tenant's whole index)
        asked = (_wording(question), _wording(answer))
        same: dict[str, bool] = {}  # validation id -> asked the same (a validation's verdicts share it)
        out: dict[tuple[str, int], list[FeedbackRow]] = {}
        seen: set[tuple[str, int, str]] = set()
        for r in rows:
            key = (r["document_id"], r["page"])
            if r["page_text"] != texts.get(key) or (*key, r["analyst"]) in seen or len(out.get(key, ())) >= per_page:
                continue
            if r["validation_id"] not in same:
                same[r["validation_id"]] = (_wording(r["question"]), _wording(r["answer"])) == asked
            if not same[r["validation_id"]]:
                continue
            seen.add((*key, r["analyst"]))
            out.setdefault(key, []).append(FeedbackRow(r["id"], r["validation_id"], r["document_id"], r["page"],
                                                       bool(r["relevant"]), r["analyst"], "", r["created"],
                                                       r["question"], r["answer"]))
        return out

    def iter_feedback(self, tenant: str, batch: int = 500) -> Iterator[FeedbackRow]:
        """The tenant's feedback joined with its validation, in the order of the verdicts'
        last updates, read in batches so a long export never holds the lock for long."""
        last = 0
        while True:
            rows = self._query(
                "SELECT f.*, v.question, v.answer FROM feedback f JOIN validations v USING (validation_id) "
                "WHERE f.tenant = ? AND f.id > ? ORDER BY f.id LIMIT ?", (tenant, last, batch))
            if not rows:
                return
            for r in rows:
                yield FeedbackRow(r["id"], r["validation_id"], r["document_id"], r["page"], bool(r["relevant"]),
                                  r["analyst"], r["page_text"], r["created"], r["question"], r["answer"])
            last = rows[-1]["id"]
