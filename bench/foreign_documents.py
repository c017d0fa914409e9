"""What the classifier says about a document that cannot hold the evidence.

A supplier's answer is checked against the PDFs it uploaded; sometimes none of them
speaks of what the question asks (the wrong file, another year, another entity). The
relevance probability should then stay low on every page, as it would for a page of
an unrelated pool. This benchmark searches each labelled query in its own documents
and in documents of the other domain's queries (a climate report for a filing's
question, a filing for a report's question: drawn with a fixed seed, two per query),
reranks the hybrid pool with the classifier and prints, for each:
the best page's probability (median, mean, max) and the share of pools that keep a
page at the threshold t (the model's default unless --threshold); and the same for the
foreign pools of questions that name something (``question_name``: "Boeing", which the
model checks the document for) and of those that do not (a report's "the company",
"... for 3M?").

    export EVIDENTIA_DATA_DIR=/tmp/evd     # both sets' documents indexed
    python bench/foreign_documents.py --queries split/heldout_queries.jsonl \\
        --foreign-queries cr/heldout_queries.jsonl [--model DIR] [--threshold 0.12] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from evidentia.config import Settings
from evidentia.engine import Engine
from evidentia.evaluation.queries import load_queries
from evidentia.reranker.classifier import ClassifierReranker
from evidentia.reranker.features import question_name


def best_probabilities(engine: Engine, reranker: ClassifierReranker, t: float, queries, doc_ids_of, stage: str,
                       pool_size: int) -> list[tuple[float, int, bool]]:
    """(best probability, pages at or above t, the question names something) of each
    query's pool in each of ``doc_ids_of(query)``."""
    out = []
    for q in queries:
        query = engine.query(q.question, q.answer)
        for doc_ids in doc_ids_of(q):
            pool = engine.retrieve(query, doc_ids, stage, pool_size)
            probabilities = [p.probability for p in reranker.rerank(query, pool).pages]
            kept = sum(p >= t for p in probabilities)
            out.append((max(probabilities, default=0.0), kept, question_name(q.question) is not None))
    return out


def summary(rows: list[tuple[float, int, bool]]) -> dict:
    best = [b for b, _k, _n in rows]
    return {"pools": len(rows), "best_p_median": round(statistics.median(best), 3),
            "best_p_mean": round(statistics.mean(best), 3), "best_p_max": round(max(best), 3),
            "pools_keeping_a_page": round(sum(k > 0 for _b, k, _n in rows) / len(rows), 3),
            "pages_kept_mean": round(statistics.mean(k for _b, k, _n in rows), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=Path, required=True, help="labelled queries (the eval format)")
    ap.add_argument("--foreign-queries", type=Path, required=True,
                    help="the other domain's queries: their documents cannot hold --queries' evidence, and back")
    ap.add_argument("--model", type=Path, default=None, help="classifier model directory (default: EVIDENTIA_CLASSIFIER_MODEL or the shipped one)")
    ap.add_argument("--threshold", type=float, default=None, help="t (default: the model's)")
    ap.add_argument("--per-query", type=int, default=2, help="foreign documents per query")
    ap.add_argument("--stage", default="hybrid")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    settings = Settings.from_env()
    engine = Engine(settings)
    reranker = ClassifierReranker(args.model or settings.classifier_model, threshold=None, embedder=engine.embedder)
    reranker.attach_backend(engine.backend)
    t = args.threshold if args.threshold is not None else reranker.default_threshold
    if t is None:
        t = settings.classifier_threshold
    sets = {"queries": load_queries(args.queries), "foreign": load_queries(args.foreign_queries)}
    docs = {name: sorted({d for q in qs for d in q.doc_ids}) for name, qs in sets.items()}
    missing = engine.missing_documents(docs["queries"] + docs["foreign"])
    if missing:
        print(f"error: not indexed: {', '.join(missing[:5])}", file=sys.stderr)
        return 1
    rng = random.Random(args.seed)
    result = {"model": reranker.model_version, "t": t}
    for name, other in (("queries", "foreign"), ("foreign", "queries")):
        qs = sets[name]
        pick = min(args.per_query, len(docs[other]))
        result[f"{name}: own documents"] = summary(best_probabilities(
            engine, reranker, t, qs, lambda q: [list(q.doc_ids)], args.stage, settings.pool_size))
        foreign = best_probabilities(engine, reranker, t, qs, lambda q: [[d] for d in rng.sample(docs[other], pick)],
                                     args.stage, settings.pool_size)
        result[f"{name}: foreign documents"] = summary(foreign)
        for named, label in ((True, "naming something"), (False, "naming nothing")):
            rows = [r for r in foreign if r[2] == named]
            if rows and len(rows) < len(foreign):
                result[f"{name}: foreign documents, questions {label}"] = summary(rows)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"model {result['model']}, t = {result['t']}")
        for key, row in result.items():
            if isinstance(row, dict):
                print(f"  {key}: {row['pools']} pools, best p median {row['best_p_median']:.3f} "
                      f"(mean {row['best_p_mean']:.3f}, max {row['best_p_max']:.3f}); "
                      f"{row['pools_keeping_a_page']:.0%} keep a page at t ({row['pages_kept_mean']:.2f} pages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
