"""Training records for the classifier reranker.

A record is ``{"question", "answer", "page_text", "relevance": 0|1, "doc_id", "page"}``,
optionally with ``"soft_label"``: the probability (0..1) that the page is relevant, which
training uses as the target instead of ``relevance`` (distilled labels, training/distill.py),
and ``"weight"``: how much the record counts in the features model's fit (default 1;
``evidentia dataset --record-weight``), so that one large source of records does not
outweigh the others.
Sources:
- labelled queries (the evaluation format): relevant pages are positives, BM25
  candidates of the same document that are not relevant are hard negatives (pages
  judged partly relevant are left out: neither), and
  random other pages of the document are negatives too (``document_negatives``);
  and, given documents that cannot hold the queries' evidence (another domain's),
  the top of each query's pool in one of them (``foreign_negatives``);
- ClimRetrieve passages (``passages.jsonl``): the expert-marked passage (with its
  surrounding context, which reads like a page) is a positive; passages marked
  for *other* questions of the same report are negatives, unless they were also
  marked for this one.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from evidentia.evaluation.climretrieve import passage_text, printed_page
from evidentia.evaluation.queries import json_objects
from evidentia.text import json_line

if TYPE_CHECKING:  # pragma: no cover
    from evidentia.engine import Engine


@dataclass(frozen=True)
class TrainingRecord:
    question: str
    answer: str
    page_text: str
    relevance: int
    doc_id: str
    page: int | None
    source: str = ""
    # Probability that the page is relevant (soft target); None: ``relevance`` is the target.
    soft_label: float | None = None
    # How much the record counts in the features model's fit; None: 1.
    weight: float | None = None

    def to_json(self) -> str:
        data = asdict(self)
        for optional in ("soft_label", "weight"):
            if data[optional] is None:
                del data[optional]  # records without one are written as before
        return json_line(data)


def training_target(record: TrainingRecord) -> float:
    """The probability of relevance a record is trained towards: its soft label, else 0 or 1."""
    return float(record.soft_label) if record.soft_label is not None else float(record.relevance)


class DatasetError(ValueError):
    """A training file that cannot be used; says which line and why."""


# Random pages from the rest of each query's documents, besides the pool's negatives.
# Positives are every relevant page, including those the pool missed, far down their
# document; with negatives from the pool alone, the few far-ranked training pages
# were relevant twice as often as the rest, and the model learned that ranking badly
# in the document means relevant (the model shipped before them gave a page ranked
# 100th by both the cosine and BM25 three logits more than one ranked 4th).
DEFAULT_DOCUMENT_NEGATIVES = 20
# Pages from a document that cannot hold the query's evidence (drawn from another
# domain's documents: a climate report for a filing's question), all negatives. Every
# other pool comes from the question's own document, which holds its evidence, so the
# model learnt that a document's best-standing pages are likely relevant whatever the
# document: a held-out filing's question searched in a held-out climate report got a
# best page at median p 0.26, and 98 % of such pools kept pages at the default threshold
# (docs/BENCHMARKS.md, section 8p). The top of the query's pool there: the pages that
# look most like evidence. Training lets them teach the document calibration only
# (training/train_features.py).
DEFAULT_FOREIGN_NEGATIVES = 5
FOREIGN_SOURCE = "foreign"  # the records' ``source``: training leaves their pools out of the threshold


def first_stage_pool(engine: "Engine", query, doc_ids, stage: str, pool_size: int = 20):
    """The ``stage`` pool of a query; BM25's where a document has no page vectors
    (indexed with dense retrieval off), as the engine's default stage falls back."""
    return engine.retrieve_or_bm25(query, doc_ids, stage, pool_size)[0]


def stable_share(key: str) -> float:
    """A number in [0, 1) fixed by ``key`` (its sha256): the same split every run."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0 ** 64


def records_from_queries(queries: Iterable, engine: "Engine", negatives_per_query: int = 8,
                         pool_size: int = 20, stage: str = "bm25",
                         document_negatives: int = DEFAULT_DOCUMENT_NEGATIVES, seed: int = 0,
                         foreign_doc_ids: Sequence[str] = (), foreign_negatives: int = DEFAULT_FOREIGN_NEGATIVES,
                         ) -> Iterator[TrainingRecord]:
    """``queries``: evaluation.queries.EvalQuery objects (id, doc_ids, question, answer, relevant);
    negatives are the ``stage`` pool's pages that are not relevant (hybrid: the pages a
    reranker behind the hybrid stage sees, including those found by meaning alone),
    then ``document_negatives`` pages drawn from the rest of the query's documents
    (seeded by the query id: the same records every run); with ``foreign_doc_ids``, the
    first ``foreign_negatives`` pages of the query's pool in one of them (drawn by the
    query id), documents that cannot hold its evidence."""
    backend = engine.backend
    for q in queries:
        # pages that answer in part are neither evidence nor negatives: never a record
        judged = q.relevant | q.partly_relevant
        seen = set(judged)
        for doc_id, page in sorted(q.relevant):
            p = backend.get_page(doc_id, page)
            if p is not None and p.text:
                yield TrainingRecord(q.question, q.answer, p.text, 1, doc_id, page, "queries")
        taken = 0
        query = engine.query(q.question, q.answer)
        for c in first_stage_pool(engine, query, q.doc_ids, stage, pool_size):
            seen.add((c.doc_id, c.page))
            if taken >= negatives_per_query:
                continue  # still seen: a document negative is a page the pool did not hold
            if (c.doc_id, c.page) in judged or not c.text:
                continue
            yield TrainingRecord(q.question, q.answer, c.text, 0, c.doc_id, c.page, "queries")
            taken += 1
        if document_negatives > 0:
            yield from _document_negatives(q, backend, seen, document_negatives, seed)
        if foreign_negatives > 0:
            yield from _foreign_negatives(q, query, engine, foreign_doc_ids, foreign_negatives, stage, pool_size, seed)


def _foreign_negatives(q, query, engine: "Engine", foreign_doc_ids: Sequence[str], count: int, stage: str,
                       pool_size: int, seed: int) -> Iterator[TrainingRecord]:
    """``q``: the labelled query; ``query``: its built query record (the pool's)."""
    choices = sorted(set(foreign_doc_ids) - set(q.doc_ids))
    if not choices:
        return
    doc_id = random.Random(f"{seed}:foreign:{q.id}").choice(choices)
    pool = first_stage_pool(engine, query, [doc_id], stage, pool_size)
    for c in [c for c in pool if c.text and c.text.strip()][:count]:
        yield TrainingRecord(q.question, q.answer, c.text, 0, c.doc_id, c.page, FOREIGN_SOURCE)


def _document_negatives(query, backend, seen: set, count: int, seed: int) -> Iterator[TrainingRecord]:
    candidates = []
    for doc_id in sorted(query.doc_ids):
        info = backend.get_document(doc_id)
        if info is not None:
            candidates.extend((doc_id, n) for n in range(1, info.pages + 1) if (doc_id, n) not in seen)
    rng = random.Random(f"{seed}:{query.id}")
    yielded = 0
    for doc_id, page in rng.sample(candidates, len(candidates)):
        if yielded >= count:
            break
        p = backend.get_page(doc_id, page)
        if p is not None and p.text and p.text.strip():
            yield TrainingRecord(query.question, query.answer, p.text, 0, doc_id, page, "document")
            yielded += 1


def records_from_climretrieve(passages_file: Path, negatives_per_positive: int = 2,
                              min_relevance: int = 1, seed: int = 0) -> Iterator[TrainingRecord]:
    with open(passages_file, encoding="utf-8") as fh:
        rows = [obj for _n, obj in json_objects(fh, str(passages_file), DatasetError)]
    rng = random.Random(seed)
    by_report: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_report[row["report"]].append(row)
    for report, report_rows in sorted(by_report.items()):
        marked: dict[str, set[str]] = defaultdict(set)  # question -> texts marked for it
        for row in report_rows:
            marked[row["question"]].add(str(row.get("relevant_text") or ""))
        for row in report_rows:
            relevance = row.get("relevance")
            if relevance is None or int(relevance) < min_relevance:
                continue
            text = passage_text(row)
            if not text:
                continue
            answer = str(row.get("answer") or "")
            yield TrainingRecord(row["question"], answer, text, 1, report, printed_page(row), "climretrieve")
            others = [o for o in report_rows
                      if o["question"] != row["question"] and str(o.get("relevant_text") or "") not in marked[row["question"]]
                      and passage_text(o)]
            for other in rng.sample(others, min(negatives_per_positive, len(others))):
                yield TrainingRecord(row["question"], answer, passage_text(other), 0, report, printed_page(other),
                                     "climretrieve")


def dedupe(records: Iterable[TrainingRecord]) -> list[TrainingRecord]:
    """One record per (question, answer, page text); a positive wins over a negative, else the first."""
    best: dict[tuple, TrainingRecord] = {}
    for r in records:
        key = (r.question, r.answer, r.page_text)
        if key not in best or r.relevance > best[key].relevance:
            best[key] = r
    return list(best.values())


def write_records(records: Sequence[TrainingRecord], path: Path) -> str:
    """Write JSONL; return the SHA-256 of what was written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(r.to_json() + "\n" for r in records)
    path.write_text(data, encoding="utf-8")
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


REQUIRED = {"question": str, "answer": str, "page_text": str, "relevance": int}


# The index stores a page number as a 32-bit integer (es_mappings/pages.json).
MAX_PAGE = 2 ** 31 - 1
TEXT_FIELDS = ("question", "answer", "page_text", "doc_id", "source")


def _lone_surrogate(text: str) -> str | None:
    """The first lone surrogate of ``text`` (JSON "\\ud800" decodes to one), which no
    UTF-8 writer accepts: a record holding one failed later, with a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def read_records(path: Path) -> list[TrainingRecord]:
    out = []
    with open(path, encoding="utf-8") as fh:
        try:
            for n, obj in json_objects(fh, str(path), DatasetError):
                out.append(_record(path, n, obj))
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{path}: not UTF-8 text ({exc.reason})") from None
    if not out:
        raise DatasetError(f"{path}: no records")
    return out


def _record(path: Path, n: int, obj: dict) -> TrainingRecord:
    """Line ``n``'s record, every field type-checked: a wrong one is a DatasetError naming
    the line (the CLI's `error: ...`, exit 1), never a traceback or a silent coercion."""
    for key, typ in REQUIRED.items():
        if key not in obj:
            raise DatasetError(f"{path}, line {n}: missing field {key!r}")
        if not isinstance(obj[key], typ) or isinstance(obj[key], bool):
            raise DatasetError(f"{path}, line {n}: field {key!r} must be {typ.__name__}")
    if obj["relevance"] not in (0, 1):
        raise DatasetError(f"{path}, line {n}: relevance must be 0 or 1, not {obj['relevance']}")
    for key in ("doc_id", "source"):  # optional: absent or null reads as ""
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise DatasetError(f"{path}, line {n}: field {key!r} must be str (or null)")
    for key in TEXT_FIELDS:
        bad = _lone_surrogate(obj.get(key) or "")
        if bad is not None:
            raise DatasetError(f"{path}, line {n}: field {key!r} holds a lone surrogate "
                               f"(\\u{ord(bad):04x}), which is not text")
    page = obj.get("page")
    # 1.7 and true were read as page 1; 1e400 (infinity), "abc" and [1] failed later with a traceback
    if page is not None and (not isinstance(page, int) or isinstance(page, bool) or not 1 <= page <= MAX_PAGE):
        raise DatasetError(f"{path}, line {n}: page must be a positive integer (or null), not {_shown(page)}")
    soft = obj.get("soft_label")
    if soft is not None:
        if not isinstance(soft, (int, float)) or isinstance(soft, bool) or not 0.0 <= soft <= 1.0:
            raise DatasetError(f"{path}, line {n}: soft_label must be a number between 0 and 1 "
                               f"(or null), not {json.dumps(soft)}")
        soft = float(soft)
    weight = obj.get("weight")
    if weight is not None:
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0.0 < weight < float("inf"):
            raise DatasetError(f"{path}, line {n}: weight must be a positive number (or null), "
                               f"not {json.dumps(weight)}")
        weight = float(weight)
    return TrainingRecord(obj["question"], obj["answer"], obj["page_text"], obj["relevance"],
                          obj.get("doc_id") or "", page, obj.get("source") or "", soft, weight)


def _shown(value) -> str:
    """A field's value for an error line: JSON, at most 40 characters, never raising."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def split_groups(groups: Sequence[str], test_fraction: float, seed: int = 0) -> set[str]:
    """A deterministic set of held-out groups (documents or companies): groups are
    ordered by a seeded hash and taken until ``test_fraction`` of them are held out."""
    ordered = sorted(set(groups), key=lambda g: hashlib.sha256(f"{seed}:{g}".encode()).hexdigest())
    n_test = max(1, round(len(ordered) * test_fraction)) if ordered and test_fraction > 0 else 0
    return set(ordered[:n_test])

