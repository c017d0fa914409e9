"""Do pages too short to hold evidence (a cover, a back page: a few words) rank among
a report's evidence? Questionnaire questions searched in each document alone, as a
supplier uploads one report; no labels are needed, as a page of a handful of words
holds no answer.

For each (question, document): the hybrid pool (EVIDENTIA_POOL_SIZE) reranked by the
classifier (EVIDENTIA_CLASSIFIER_MODEL, else the shipped model) with every page kept;
then where the pool's short pages (at most ``--max-words`` words) rank, their
probability, whether the default threshold keeps them, and where hybrid alone had
ranked them.

Trained on reports generated one page per expert-marked passage (some a few words
long and marked relevant), the model learnt that a short page is evidence, which a
real report's cover never is (docs/BENCHMARKS.md section 8q); the shipped model also
learns from the reports' printed pages, each report with its cover (section 8r).

    EVIDENTIA_DATA_DIR=/tmp/bhp evidentia index ../shared/data/csr-samples
    EVIDENTIA_DATA_DIR=/tmp/bhp python bench/short_pages.py [--doc ID ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from evidentia.config import Settings
from evidentia.engine import Engine

# Written for sustainability reports (CSR questionnaires ask such questions of every supplier).
QUESTIONS = (
    "What are the company's scope 3 emissions targets?",
    "Does the company have a medium-term target for operational emissions?",
    "Does the company report the climate change scenarios used?",
    "Does the company have a net zero target?",
    "How does the company engage with suppliers on emissions?",
    "What were the company's scope 1 and 2 emissions?",
    "Is executive remuneration linked to climate targets?",
    "What physical climate risks has the company identified?",
    "Does the company use carbon offsets?",
    "How does the board oversee climate change?",
    "Does the company support a price on carbon?",
    "How much does the company invest in low-emissions technology?",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc", action="append", help="document id (repeatable; default: every indexed document)")
    ap.add_argument("--max-words", type=int, default=15, help="a page of at most this many words is 'short'")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    settings = Settings.from_env()
    engine = Engine(settings)
    docs = args.doc or [d.doc_id for d in engine.backend.list_documents()]
    if not docs:
        print("error: no indexed document (evidentia index FOLDER first)", file=sys.stderr)
        return 2
    words = {}
    for doc_id in docs:
        document = engine.backend.stored_document(doc_id)
        if document is None:
            print(f"error: unknown document {doc_id!r}", file=sys.stderr)
            return 2
        words.update({(doc_id, p.page): len(p.text.split()) for p in document.pages})
    config = engine.config(stage="hybrid", reranker="classifier", threshold=0.0)
    t = engine.reranker(config).default_threshold or settings.classifier_threshold
    rows = []
    for question in QUESTIONS:
        for doc_id in docs:
            result = engine.search(question, "", [doc_id], config)
            short = [{"rank": i + 1, "page": p.page, "words": words[(p.doc_id, p.page)], "p": round(p.probability, 3)}
                     for i, p in enumerate(result.pages) if words[(p.doc_id, p.page)] <= args.max_words]
            first_stage = [i + 1 for i, c in enumerate(result.candidates) if words[(c.doc_id, c.page)] <= args.max_words]
            rows.append({"question": question, "doc_id": doc_id, "short_pages": short, "hybrid_ranks": first_stage})
            if not args.json:
                top = result.pages[0] if result.pages else None
                print(f"{doc_id[:28]:28s} {question[:58]:58s} first: p.{top.page if top else '-'} "
                      f"({words[(top.doc_id, top.page)] if top else 0} words); short pages: "
                      + (", ".join(f"#{s['rank']} p.{s['page']} ({s['words']} w) p={s['p']}" for s in short) or "none"))
    summary = {"searches": len(rows), "short_pages_max_words": args.max_words, "threshold": t,
               "searches_with_a_short_page_in_the_pool": sum(bool(r["short_pages"]) for r in rows),
               "searches_with_a_short_page_first": sum(any(s["rank"] == 1 for s in r["short_pages"]) for r in rows),
               "searches_with_a_short_page_in_the_top_3": sum(any(s["rank"] <= 3 for s in r["short_pages"])
                                                            for r in rows),
               "short_pages_kept_at_t": sum(s["p"] >= t for r in rows for s in r["short_pages"]),
               "hybrid_alone: searches_with_a_short_page_first": sum(1 in r["hybrid_ranks"] for r in rows),
               "hybrid_alone: searches_with_a_short_page_in_the_top_3": sum(any(k <= 3 for k in r["hybrid_ranks"])
                                                                          for r in rows)}
    if args.json:
        print(json.dumps({"summary": summary, "rows": rows}, indent=2))
    else:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
