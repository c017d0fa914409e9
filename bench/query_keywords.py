"""What a change to query building does to the keywords of labelled queries.

Every BM25 search reads ``Query.keywords`` (retriever/query.py): a change to stop words,
language detection or number reading moves the benchmarks only through them. This
writes the keywords and language of each distinct (question, answer) of the given
query files, and with ``--against`` an earlier such file, prints those that differ:

    python bench/query_keywords.py --queries q1.jsonl q2.jsonl --out before.json   # on the old code
    python bench/query_keywords.py --queries q1.jsonl q2.jsonl --against before.json

No difference means the change cannot move a ranking of those queries (the index side
aside: pages are read by text.search_text).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from evidentia.language import LanguageDetector
from evidentia.retriever.query import build_query


def read_pairs(files: list[Path]) -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], None] = {}
    for path in files:
        for line in path.read_text(encoding="utf-8-sig").splitlines():
            if line.strip():
                row = json.loads(line)
                seen.setdefault((row.get("question", ""), row.get("answer") or ""), None)
    return list(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, help="write the keywords here")
    parser.add_argument("--against", type=Path, help="an earlier --out file to compare with")
    args = parser.parse_args()
    detector = LanguageDetector()
    built = []
    for question, answer in read_pairs(args.queries):
        query = build_query(question, answer, detector)
        built.append({"question": question, "answer": answer, "language": query.language,
                      "keywords": list(query.keywords)})
    languages = Counter(str(b["language"]) for b in built)
    print(f"{len(built)} distinct (question, answer); languages: "
          + ", ".join(f"{lang} {n}" for lang, n in languages.most_common()))
    if args.out:
        args.out.write_text(json.dumps(built, ensure_ascii=False))
    if args.against:
        earlier = {(b["question"], b["answer"]): b for b in json.loads(args.against.read_text())}
        keywords = languages = 0
        for b in built:
            old = earlier.get((b["question"], b["answer"]))
            if old is None:
                continue
            if old["keywords"] != b["keywords"]:
                keywords += 1
                print(f"keywords: {b['question'][:70]!r} {b['answer'][:30]!r}: {old['keywords']} -> {b['keywords']}")
            if old["language"] != b["language"]:
                languages += 1
        print(f"keywords changed: {keywords} of {len(built)}; language changed: {languages} "
              "(keywords alone reach BM25)")


if __name__ == "__main__":
    main()
