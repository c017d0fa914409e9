"""Evaluation queries: a JSONL file, one question per line, with its relevant pages.

One line looks like::

    {"id": "q1", "doc_id": "3M_2018_10K", "question": "...", "answer": "...",
     "relevant_pages": [60], "question_type": "metrics-generated"}

``answer`` may be left out (the question asked alone, as `evidentia search` takes it).
A query over several documents names them in ``doc_ids`` and its relevant pages
per document: ``"relevant_pages": {"docA": [3], "docB": []}``. Pages are 1-based,
as a PDF viewer numbers them. An optional ``partly_relevant_pages`` (the same forms)
names pages judged to answer the question only in part: evaluation counts them as not
relevant, and training records leave them out (neither evidence nor a negative).
Every other field is kept in ``EvalQuery.fields`` (evaluation breaks the metrics
down by the string-valued ones).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

KNOWN_FIELDS = ("id", "doc_id", "doc_ids", "question", "answer", "relevant_pages", "partly_relevant_pages")


class QueriesFileError(ValueError):
    """The queries file cannot be used; the message names the line and the problem."""


@dataclass(frozen=True)
class EvalQuery:
    id: str
    doc_ids: tuple[str, ...]
    question: str
    answer: str
    relevant: frozenset[tuple[str, int]]  # (doc_id, 1-based page)
    # pages that answer only in part: not relevant to evaluation, left out of training
    partly_relevant: frozenset[tuple[str, int]] = frozenset()
    fields: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _is_page(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _pages(value: Any, where: str, err) -> list[int]:
    if not isinstance(value, list):
        raise err(f"{where} must be a list of page numbers, not {_type_name(value)}")
    for page in value:
        if not _is_page(page):
            raise err(f"{where}: page {json.dumps(page)} is not a positive integer (pages are 1-based)")
    return value


def _page_set(raw: Any, name: str, doc_ids: tuple[str, ...], err) -> set[tuple[str, int]]:
    """``relevant_pages`` and ``partly_relevant_pages``: a list of pages (one document)
    or an object {doc_id: [pages]}."""
    pages: set[tuple[str, int]] = set()
    if isinstance(raw, dict):
        for doc_id, listed in raw.items():
            if doc_id not in doc_ids:
                raise err(f"{name} names document {doc_id!r}, which is not among the query's "
                          f"documents ({', '.join(doc_ids)})")
            pages.update((doc_id, p) for p in _pages(listed, f"{name}[{doc_id!r}]", err))
    elif isinstance(raw, list):
        if len(doc_ids) > 1:
            raise err(f"{name} must be an object {{doc_id: [pages]}} when the query has several documents")
        pages.update((doc_ids[0], p) for p in _pages(raw, name, err))
    else:
        raise err(f"field {name!r} must be a list of pages or an object {{doc_id: [pages]}}, "
                  f"not {_type_name(raw)}")
    return pages


def _parse_line(obj: Any, err) -> EvalQuery:
    if not isinstance(obj, dict):
        raise err(f"expected a JSON object, not {_type_name(obj)}")

    if "id" not in obj:
        raise err("missing field 'id'")
    qid = obj["id"]
    if isinstance(qid, int) and not isinstance(qid, bool):
        qid = str(qid)
    if not isinstance(qid, str) or not qid.strip():
        raise err(f"field 'id' must be a non-empty string, not {json.dumps(obj['id'])}")

    if "doc_id" in obj and "doc_ids" in obj:
        raise err("give either 'doc_id' or 'doc_ids', not both")
    if "doc_id" in obj:
        doc_id = obj["doc_id"]
        if not isinstance(doc_id, str) or not doc_id.strip():
            raise err(f"field 'doc_id' must be a non-empty string, not {json.dumps(doc_id)}")
        doc_ids: tuple[str, ...] = (doc_id,)
    elif "doc_ids" in obj:
        raw = obj["doc_ids"]
        if not isinstance(raw, list) or not raw:
            raise err("field 'doc_ids' must be a non-empty list of document ids")
        for d in raw:
            if not isinstance(d, str) or not d.strip():
                raise err(f"field 'doc_ids': {json.dumps(d)} is not a non-empty string")
        if len(set(raw)) != len(raw):
            raise err("field 'doc_ids' names a document twice")
        doc_ids = tuple(raw)
    else:
        raise err("missing field 'doc_id' (or 'doc_ids')")

    obj = {"answer": "", **obj}  # a question asked without an answer, as `evidentia search` takes it
    for name in ("question", "answer"):
        if name not in obj:
            raise err(f"missing field {name!r}")
        if not isinstance(obj[name], str):
            raise err(f"field {name!r} must be a string, not {_type_name(obj[name])}")
    if not obj["question"].strip():
        raise err("field 'question' is empty")

    if "relevant_pages" not in obj:
        raise err("missing field 'relevant_pages'")
    relevant = _page_set(obj["relevant_pages"], "relevant_pages", doc_ids, err)
    partly = _page_set(obj.get("partly_relevant_pages", {}), "partly_relevant_pages", doc_ids, err)
    if partly & relevant:
        raise err("partly_relevant_pages repeats a page of relevant_pages")

    extra = {k: v for k, v in obj.items() if k not in KNOWN_FIELDS}
    return EvalQuery(id=qid, doc_ids=doc_ids, question=obj["question"], answer=obj["answer"],
                     relevant=frozenset(relevant), partly_relevant=frozenset(partly), fields=extra)


def parse_queries(lines, source: str = "queries file") -> list[EvalQuery]:
    """Parse JSONL lines (blank lines are skipped). Raises ``QueriesFileError``."""
    queries: list[EvalQuery] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue

        def err(msg: str, _n: int = lineno) -> QueriesFileError:
            return QueriesFileError(f"{source}, line {_n}: {msg}")

        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise err(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
        query = _parse_line(obj, err)
        if query.id in first_line:
            raise err(f"duplicate id {query.id!r} (first used on line {first_line[query.id]})")
        first_line[query.id] = lineno
        queries.append(query)
    if not queries:
        raise QueriesFileError(f"{source}: no queries in the file")
    return queries


def load_queries(path: Path) -> list[EvalQuery]:
    return parse_queries(read_jsonl_lines(path), source=str(Path(path)))


def json_objects(lines: Iterable[str], source: str, error: type[Exception]) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank JSONL line; ``error``, the caller's
    exception, names the line that is not a JSON object."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{source}, line {n}: invalid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise error(f"{source}, line {n}: expected a JSON object")
        yield n, obj


def read_jsonl_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 JSONL file, or QueriesFileError saying why it cannot be read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise QueriesFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise QueriesFileError(f"{path}: is a folder, not a JSONL file") from None
    except OSError as exc:
        raise QueriesFileError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise QueriesFileError(f"{path}, line {line}: not UTF-8 text ({exc.reason})") from None
    # split on "\n" only: str.splitlines would also cut at U+2028 and friends inside JSON strings
    return text.split("\n")


MISSING_CATEGORY = "(missing)"


def category_fields(queries: list[EvalQuery], min_values: int = 2, max_values: int = 30) -> dict[str, list[str]]:
    """Extra fields worth a per-category breakdown: every value is a string and there
    are between ``min_values`` and ``max_values`` distinct ones. Returns field ->
    its values, most frequent first (ties by name); queries lacking the field are
    grouped under ``MISSING_CATEGORY``, listed last."""
    names: list[str] = []
    for q in queries:
        names.extend(n for n in q.fields if n not in names)
    result: dict[str, list[str]] = {}
    for name in names:
        values = [q.fields[name] for q in queries if name in q.fields]
        if not all(isinstance(v, str) for v in values):
            continue
        counts: dict[str, int] = {}
        for v in values:
            counts[v] = counts.get(v, 0) + 1
        if not min_values <= len(counts) <= max_values:
            continue
        ordered = sorted(counts, key=lambda v: (-counts[v], v))
        if len(values) < len(queries):
            ordered.append(MISSING_CATEGORY)
        result[name] = ordered
    return result


def category_of(query: EvalQuery, name: str) -> str:
    value = query.fields.get(name)
    return value if isinstance(value, str) else MISSING_CATEGORY
