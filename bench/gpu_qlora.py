"""The `lora` classifier path on a CUDA GPU: 4-bit NF4 (QLoRA) training with
`evidentia train`, then the classifier reranker loading and scoring the model.

No Llama-class weights can be fetched here, so the base is a Llama-architecture
decoder built from a config with random weights, at Llama-3-8B's layer shapes
(hidden 4096, 32 heads, 8 key-value heads, MLP 14336) and ``--layers`` layers.
What it shows is the machinery, not a model's quality: the base is loaded in
4-bit NF4 by the same code a user runs, trained (LoRA on every linear layer,
classification head trained fully), written, reloaded by ``ClassifierReranker``
and used to score a 20-page pool. The records are synthetic and separable (pages
about emissions against pages about the canteen, inside filler text), so a
working path must reach a high held-out AUROC from a random base.

Printed (JSON): versions, whether the base was loaded in 4 bits, trainable
parameters, seconds per optimizer step, peak GPU memory in training, the loaded
base's footprint against bf16's, held-out AUROC at training time and after the
reload, and the Platt calibration refitted on the reloaded model's held-out
margins (the stored one when the reload computes the training-time margins),
the latency of scoring a 20-page pool, and the CLI's exit code.

Without bitsandbytes (no `[gpu]` extra) the same code trains LoRA on the base in
its own precision on the GPU: the bench then checks that path.

Usage (on a CUDA machine; `pip install -e ".[gpu]"` for 4 bits):
    python bench/gpu_qlora.py [--layers 4] [--steps 60] [--work DIR] [--base-model PATH_OR_NAME]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RELEVANT = ["carbon", "emissions", "scope", "tonnes", "greenhouse", "gas", "reduced", "climate", "co2e", "target"]
IRRELEVANT = ["canteen", "football", "picnic", "music", "garden", "lunch", "holiday", "party", "choir", "bakery"]
FILLER = [f"w{i}" for i in range(400)]
QUESTION = "what were the scope 1 carbon emissions"
ANSWER = "emissions were reduced to 120 tonnes"


def page_text(rng: random.Random, topic: list[str], words: int = 300) -> str:
    """Mostly filler, with one word in eight from the topic: the signal sits inside noise."""
    return " ".join(rng.choice(topic) if rng.random() < 0.125 else rng.choice(FILLER) for _ in range(words))


def write_base(directory: Path, layers: int) -> None:
    """A Llama-architecture classifier (random weights, bf16) with Llama-3-8B's
    layer shapes and a word-level tokenizer without a pad token, as Llama ships."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>"] + sorted(set(RELEVANT + IRRELEVANT + FILLER + (QUESTION + " " + ANSWER).split()))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                        model_max_length=4096)
    tokenizer.save_pretrained(str(directory))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=4096, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                         max_position_embeddings=4096, num_labels=2, bos_token_id=1, eos_token_id=2,
                         pad_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):  # random init of a billion weights takes minutes on a CPU
        model = LlamaForSequenceClassification(config).to(torch.bfloat16)
    model.save_pretrained(str(directory), safe_serialization=True)
    del model
    torch.cuda.empty_cache()


def records(n_docs: int, per_doc: int, seed: int = 0):
    from evidentia.training.dataset import TrainingRecord

    rng = random.Random(seed)
    out = []
    for d in range(n_docs):
        for k in range(per_doc):
            out.append(TrainingRecord(QUESTION, ANSWER, page_text(rng, RELEVANT), 1, f"doc{d}", 2 * k + 1, "synthetic"))
            out.append(TrainingRecord(QUESTION, ANSWER, page_text(rng, IRRELEVANT), 0, f"doc{d}", 2 * k + 2, "synthetic"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4, help="decoder layers at Llama-3-8B's shapes (it has 32)")
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps")
    ap.add_argument("--work", type=Path, default=None, help="folder for the base and trained models (default: a temporary one)")
    ap.add_argument("--base-model", default=None, help="a real base instead (path or hub name, e.g. "
                    "meta-llama/Meta-Llama-3-8B on a machine that has it): the same checks, --layers ignored")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("gpu_qlora: no CUDA device; this benchmark measures the GPU path", file=sys.stderr)
        return 2
    try:
        import bitsandbytes
        bnb_version = bitsandbytes.__version__
    except ImportError:  # the path of a GPU user without the [gpu] extra: LoRA on a full-precision base
        bnb_version = None
    import peft
    import transformers
    from sklearn.metrics import roc_auc_score

    from evidentia.reranker import classifier_model
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.reranker.classifier_model import load_base_classifier, load_tokenizer, parameter_count
    from evidentia.records import Candidate
    from evidentia.retriever.query import build_query
    from evidentia.training.dataset import write_records
    from evidentia.training.train import TrainParams, fit_calibration, train

    work = args.work or Path(tempfile.mkdtemp(prefix="evidentia-gpu-"))
    model_dir, cli_dir = work / "trained", work / "trained-cli"
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "transformers": transformers.__version__, "peft": peft.__version__,
                    "bitsandbytes": bnb_version}
    if args.base_model:
        base_dir = args.base_model
        result["base_model"] = base_dir
    else:
        base_dir = work / "base"
        base_dir.mkdir(exist_ok=True)
        t = time.perf_counter()
        result["base_model"] = f"random Llama, Llama-3-8B's layer shapes, {args.layers} layers"
        write_base(base_dir, args.layers)
        result["write_base_s"] = round(time.perf_counter() - t, 1)
    base_dir = str(base_dir)

    tokenizer = load_tokenizer(base_dir)
    base = load_base_classifier(base_dir, tokenizer)
    result["base_parameters"] = parameter_count(base)
    result["base_loaded_in_4bit"] = bool(getattr(base, "is_loaded_in_4bit", False))
    result["base_dtype"] = str(next(p.dtype for p in base.parameters() if p.dtype.is_floating_point))
    result["base_footprint_gib"] = round(base.get_memory_footprint() / 2**30, 3)
    result["base_footprint_bf16_gib"] = round(result["base_parameters"] * 2 / 2**30, 3)
    del base
    torch.cuda.empty_cache()

    data = records(n_docs=24, per_doc=8)
    records_path = work / "records.jsonl"
    sha = write_records(data, records_path)
    params = TrainParams(max_steps=args.steps, batch_size=8, grad_accum=1, learning_rate=3e-4, warmup_ratio=0.1,
                         eval_fraction=0.25, max_length=256)
    torch.cuda.reset_peak_memory_stats()
    log: list[str] = []
    metadata = train(data, base_dir, model_dir, params, data_sha256=sha, log=log.append, progress=False)
    result["train_log"] = log
    result["peak_training_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    m = metadata.metrics
    result["quantized_4bit"] = m["quantized_4bit"]
    result["device"] = m["device"]
    result["seconds_per_step"] = round(m["train_seconds"] / m["steps"], 3)
    result["final_loss"] = m["final_loss"]
    result["held_out_auroc_at_training"] = (m.get("held_out") or {}).get("auroc")

    # The reranker as the product loads it: base in 4 bits again, the saved adapter and
    # head on top. Its margins on the held-out records must be the ones the calibration
    # was fitted on at the end of training: refitting Platt on them gives back the
    # stored (a, b) only then. Checked also without the fp32 upcast of the unquantized
    # layers (how the reranker loaded a 4-bit model before 8z), for comparison.
    held_out = set(metadata.extra["held_out_documents"])
    evaluated = [r for r in data if r.doc_id in held_out]
    labels = [r.relevance for r in evaluated]
    stored = metadata.calibration
    result["calibration_at_training"] = {"a": round(stored.a, 4), "b": round(stored.b, 4)}
    for variant in ("without_upcast", "as_shipped"):
        torch.cuda.empty_cache()
        if variant == "without_upcast":
            saved_upcast, classifier_model.upcast_unquantized = classifier_model.upcast_unquantized, lambda _m: None
        t = time.perf_counter()
        try:
            reranker = ClassifierReranker(model_dir, threshold=None)
        finally:
            if variant == "without_upcast":
                classifier_model.upcast_unquantized = saved_upcast
        load_s = time.perf_counter() - t
        margins = reranker.margins(QUESTION, ANSWER, [r.page_text for r in evaluated])
        refit = fit_calibration(margins, labels)
        probs = reranker.probabilities(QUESTION, ANSWER, [r.page_text for r in evaluated])
        result[f"reload_{variant}"] = {
            "load_s": round(load_s, 1),
            "base_in_4bit": bool(getattr(reranker.model.base_model, "is_loaded_in_4bit", False)),
            "held_out_auroc": round(float(roc_auc_score(labels, probs)), 4),
            "calibration_refit": {"a": round(refit.a, 4), "b": round(refit.b, 4)},
        }
        if variant == "without_upcast":
            del reranker

    rng = random.Random(1)
    pool = [Candidate(doc_id="pool", page=i + 1, score=0.0,
                      text=page_text(rng, RELEVANT if i % 5 == 0 else IRRELEVANT, words=450)) for i in range(20)]
    query = build_query(QUESTION, ANSWER)
    reranker.rerank(query, pool)  # warm-up: kernels, allocator
    timings = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        ranked = reranker.rerank(query, pool)
        torch.cuda.synchronize()
        timings.append(time.perf_counter() - t)
    result["pool20_rerank_s_median"] = round(statistics.median(timings), 3)
    result["pool20_top4_pages"] = [p.page for p in ranked.pages[:4]]  # relevant pages: 1, 6, 11, 16
    del reranker
    torch.cuda.empty_cache()

    # the command a user runs, on the same records (two steps: it must train, write and report)
    cli = subprocess.run([sys.executable, "-m", "evidentia.cli", "train", "--data", str(records_path),
                          "--base-model", base_dir, "--out", str(cli_dir), "--max-steps", "2",
                          "--batch-size", "4"], capture_output=True, text=True,
                         cwd=work)  # not a checkout's root, whose evidentia/ folder would shadow the installed package
    result["cli_exit_code"] = cli.returncode
    result["cli_stderr_tail"] = cli.stderr.strip().splitlines()[-3:]
    result["cli_metrics_quantized_4bit"] = json.loads(cli.stdout).get("quantized_4bit") if cli.returncode == 0 else None
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
