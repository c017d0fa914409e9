"""Pairwise relevance on held-out ClimRetrieve reports: every (question, passage)
pair of a held-out report (training/splits/heldout.json), labelled 1 when the
experts marked the passage for the question (relevance >= 1), else 0 (marked for
another question of the same report). AUROC of each score over all pairs, and
ECE of the model's probability, over all pairs and over the pairs of questions
with at least one marked passage in the report (the setting of the pools). Each
passage is scored as a page of its report (the report's passages are the
document of the model's document features).

Scores: the untrained all-MiniLM-L6-v2 cosine (question alone; question + the
question's definition), and the classifier model given the question alone, the
question + definition as the answer, and the question + the expert's answer.

Usage: python bench/climretrieve_pairs.py [--model DIR] [--data ../shared/data/climretrieve-train]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from evidentia.evaluation.climretrieve import held_out_reports, labelled_pairs, load_definitions, load_reports, load_split
from evidentia.evaluation.metrics import expected_calibration_error


def auroc(scores, labels) -> float:
    from sklearn.metrics import roc_auc_score

    return round(float(roc_auc_score(labels, scores)), 4)


def per_query_auroc(scores, labels, queries) -> float:
    """Mean AUROC within each (report, question) having both relevant and other passages."""
    values = [auroc(scores[idx], labels[idx]) for idx in queries.values() if 0 < labels[idx].sum() < len(idx)]
    return round(float(np.mean(values)), 4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/climretrieve-train")
    ap.add_argument("--model", type=Path, default=None, help="classifier model directory (default: the shipped one)")
    args = ap.parse_args()
    from evidentia.reranker.classifier import ClassifierReranker

    reports = load_reports(args.data / "passages.jsonl")
    definitions = load_definitions(args.data / "question_definitions.jsonl")
    answers = {(r.name, q): r.answers[q] for r in reports for q in r.questions}
    pairs = labelled_pairs(reports, held_out_reports(load_split()))
    labels = np.array([p[3] for p in pairs])
    has_evidence = {(p[0], p[1]) for p in pairs if p[3]}
    answerable = np.array([(p[0], p[1]) in has_evidence for p in pairs])
    reranker = ClassifierReranker(args.model, threshold=None)
    ext = reranker.extractor
    # Each passage is a page of its report (as in the ClimRetrieve pools): the
    # model's document features compare it with the report's other passages.
    documents = {r.name: [(i + 1, u.text) for i, u in enumerate(r.units)] for r in reports}
    page_of = {(name, text): n for name, pages in documents.items() for n, text in pages}
    # group by (question, answer text) so each query is encoded once
    variants = {
        "question": lambda rep, q: "",
        "question+definition": lambda rep, q: definitions.get(q.strip(), ""),
        "question+expert answer": lambda rep, q: answers[(rep, q)],
    }
    out: dict = {"pairs": len(pairs), "relevant": int(labels.sum()), "reports": len({p[0] for p in pairs}),
                 "pairs with evidence": int(answerable.sum()),
                 "with_definition": int(sum(1 for p in pairs if definitions.get(p[1].strip())))}
    for name, answer_of in variants.items():
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, (rep, q, _text, _label) in enumerate(pairs):
            groups[(q, answer_of(rep, q))].append(i)
        feats = np.zeros((len(pairs), len(reranker.feature_model.names)))
        probs = np.zeros(len(pairs))
        for (q, a), idx in groups.items():
            pool = ext.pool_features(q, a, [(pairs[i][0], page_of[(pairs[i][0], pairs[i][2])], pairs[i][2])
                                            for i in idx], document_source=documents.get)
            feats[idx] = pool.rows
            probs[idx] = reranker.feature_model.pool_probabilities(pool)
        queries = defaultdict(list)
        for i, (rep, q, _text, _label) in enumerate(pairs):
            queries[(rep, q)].append(i)
        out[name] = {"untrained cosine AUROC": auroc(feats[:, 0], labels), "model AUROC": auroc(probs, labels),
                     # within one (report, question): the order the product shows
                     "per query: untrained cosine AUROC": per_query_auroc(feats[:, 0], labels, queries),
                     "per query: model AUROC": per_query_auroc(probs, labels, queries),
                     "model ECE": round(expected_calibration_error(probs.tolist(), labels.tolist()), 4),
                     "mean probability": round(float(probs.mean()), 4),
                     # the pools' setting: (report, question) pairs with at least one marked passage
                     "with evidence: untrained cosine AUROC": auroc(feats[answerable, 0], labels[answerable]),
                     "with evidence: model AUROC": auroc(probs[answerable], labels[answerable]),
                     "with evidence: model ECE": round(expected_calibration_error(
                         probs[answerable].tolist(), labels[answerable].tolist()), 4)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
