"""Fine-tune a sequence-classification reranker with LoRA (QLoRA on a GPU).

LoRA r=32, alpha=16 on all linear layers; the classification head is trained
fully (PEFT ``modules_to_save``), not adapted. With CUDA and bitsandbytes the
base model is loaded in 4-bit NF4 (QLoRA); on a CPU the same code runs in full
precision. At the end: accuracy, F1 and AUROC on a held-out split (by document,
so no page of a held-out document is ever trained on), and a Platt calibration
of the probabilities fitted on that split.

Targets: a record's ``soft_label`` (the probability that the page is relevant,
from distilled LLM judgements) when it has one, else its 0/1 ``relevance``; the
loss is the cross-entropy against the target distribution ``[1 - p, p]``, which
for 0/1 targets is the ordinary cross-entropy. The held-out metrics and the
calibration use the hard ``relevance``.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from evidentia.retriever.query import query_text
from evidentia.reranker.classifier_model import (
    Calibration,
    METADATA_FILE,
    InputFormat,
    ModelMetadata,
    cuda_available,
    encode_windows,
    load_base_classifier,
    load_tokenizer,
    model_device,
    parameter_count,
    score_margins,
)
from evidentia.runtime import set_torch_threads
from evidentia.text import keywords
from evidentia.training.dataset import TrainingRecord, split_groups, training_target


@dataclass(frozen=True)
class TrainParams:
    epochs: float = 1.0
    batch_size: int = 2  # per device
    grad_accum: int = 2
    learning_rate: float = 2e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.05
    lora_r: int = 32
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    max_length: int = 256
    window_overlap: int = 64
    max_windows: int = 8
    eval_fraction: float = 0.15
    seed: int = 0
    max_steps: int | None = None  # optimizer steps; None = epochs decide
    gradient_checkpointing: bool = False
    threads: int | None = None  # torch intra-op threads; None = torch's default
    # Windows of each non-relevant page used as negatives. The reranker scores a
    # page by its best window, so a weak model that was only shown one window per
    # negative page lets long negative pages win on their luckiest window.
    negative_windows: int = 1


class TrainingError(RuntimeError):
    pass


def best_window(tokenizer, record: TrainingRecord, windows: list[list[int]]) -> list[int]:
    """The window of the page (``encode_windows``) that shares most keywords with
    the query: the reranker scores a page by its best window, so it is trained on
    best windows."""
    if len(windows) == 1:
        return windows[0]
    wanted = set(keywords(query_text(record.question, record.answer), None))
    def overlap(ids: list[int]) -> int:
        return len(wanted & set(keywords(tokenizer.decode(ids), None)))
    return max(windows, key=overlap)


def _lora_model(model, params: TrainParams):
    from peft import LoraConfig, TaskType, get_peft_model, prepare_model_for_kbit_training

    if getattr(model, "is_loaded_in_4bit", False):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=params.gradient_checkpointing)
    config = LoraConfig(
        task_type=TaskType.SEQ_CLS,  # puts the classification head in modules_to_save: trained fully
        r=params.lora_r,
        lora_alpha=params.lora_alpha,
        lora_dropout=params.lora_dropout,
        target_modules="all-linear",
    )
    return get_peft_model(model, config)


def classification_metrics(labels: Sequence[int], probs: Sequence[float]) -> dict[str, float | None]:
    from sklearn.metrics import accuracy_score, f1_score, roc_auc_score

    preds = [int(p >= 0.5) for p in probs]
    out: dict[str, float | None] = {
        "accuracy": round(float(accuracy_score(labels, preds)), 4),
        "f1": round(float(f1_score(labels, preds, zero_division=0)), 4),
        "auroc": None,
        "positives": int(sum(labels)),
        "records": len(labels),
    }
    if len(set(labels)) == 2:
        out["auroc"] = round(float(roc_auc_score(labels, probs)), 4)
    return out


def fit_calibration(margins: Sequence[float], labels: Sequence[int]) -> Calibration:
    """Platt scaling on held-out margins; identity when the split has one class."""
    if len(set(labels)) < 2:
        return Calibration()
    from sklearn.linear_model import LogisticRegression

    # Fitted on standardised margins: on raw margins that differ by little (a
    # barely trained model) the solver stops at a=0, i.e. p=0.5 for every page.
    mean = sum(margins) / len(margins)
    scale = (sum((m - mean) ** 2 for m in margins) / len(margins)) ** 0.5 or 1.0
    lr = LogisticRegression(C=1e4)
    lr.fit([[(m - mean) / scale] for m in margins], list(labels))
    a = float(lr.coef_[0][0]) / scale
    return Calibration(a=a, b=float(lr.intercept_[0]) - a * mean)


def train(records: Sequence[TrainingRecord], base_model: str, out_dir: Path, params: TrainParams = TrainParams(),
          data_sha256: str = "", log: Callable[[str], None] = print, progress: bool = True) -> ModelMetadata:
    import torch
    from evidentia.progress import Progress

    if not records:
        raise TrainingError("no training records")
    random.seed(params.seed)
    torch.manual_seed(params.seed)
    set_torch_threads(params.threads or 0)
    held_out_docs = split_groups([r.doc_id for r in records], params.eval_fraction, params.seed)
    train_set = [r for r in records if r.doc_id not in held_out_docs]
    eval_set = [r for r in records if r.doc_id in held_out_docs]
    if not train_set:
        raise TrainingError("the held-out split took every document; lower --eval-fraction or add documents")
    if len({r.relevance for r in train_set}) < 2:
        raise TrainingError("training records need both relevant (1) and non-relevant (0) examples")
    log(f"training on {len(train_set)} records ({sum(r.relevance for r in train_set)} relevant), "
        f"held out {len(eval_set)} records from {len(held_out_docs)} document(s)")

    fmt = InputFormat(params.max_length, params.window_overlap, params.max_windows)
    tokenizer = load_tokenizer(base_model)
    model = load_base_classifier(base_model, tokenizer)
    quantized = getattr(model, "is_loaded_in_4bit", False)
    device = "cuda" if cuda_available() else "cpu"
    model = _lora_model(model, params)
    if not quantized:
        model.to(device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = parameter_count(model)
    log(f"base {base_model}: {'4-bit NF4 (QLoRA)' if quantized else 'full precision'} on {device}; "
        f"trainable {trainable:,} of {total:,} parameters")

    examples = []
    window_rng = random.Random(params.seed)
    for r in train_set:
        windows = encode_windows(tokenizer, r.question, r.answer, r.page_text, fmt)
        best = best_window(tokenizer, r, windows)
        examples.append((best, training_target(r)))
        if r.relevance == 0 and params.negative_windows > 1:
            others = [w for w in windows if w != best]
            for w in window_rng.sample(others, min(len(others), params.negative_windows - 1)):
                examples.append((w, training_target(r)))
    steps_per_epoch = math.ceil(len(examples) / (params.batch_size * params.grad_accum))
    total_steps = params.max_steps or max(1, math.ceil(steps_per_epoch * params.epochs))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=params.learning_rate, weight_decay=params.weight_decay)
    warmup = int(total_steps * params.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / max(1, warmup) if s < warmup else max(0.0, (total_steps - s) / max(1, total_steps - warmup)))
    model.train()
    dev = model_device(model)
    rng = random.Random(params.seed)
    order: list[int] = []
    step, micro, running = 0, 0, None
    started = time.perf_counter()
    bar = Progress(total_steps, "training", "steps", show=progress)
    while step < total_steps:
        if not order:
            order = list(range(len(examples)))
            rng.shuffle(order)
        batch = [examples[order.pop()] for _ in range(min(params.batch_size, len(order)))]
        padded = tokenizer.pad({"input_ids": [ids for ids, _ in batch]}, return_tensors="pt")
        targets = torch.tensor([target for _, target in batch], device=dev, dtype=torch.float32)
        out = model(input_ids=padded["input_ids"].to(dev), attention_mask=padded["attention_mask"].to(dev))
        loss = torch.nn.functional.cross_entropy(out.logits.float(), torch.stack([1.0 - targets, targets], dim=1))
        (loss / params.grad_accum).backward()
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        micro += 1
        if micro % params.grad_accum == 0:
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            bar.update(1)
            bar.note(f"loss {running:.4f}")
    bar.close()
    train_seconds = time.perf_counter() - started
    model.eval()

    metrics: dict = {"train_seconds": round(train_seconds, 1), "steps": total_steps,
                     "examples_per_second": round(total_steps * params.batch_size * params.grad_accum / train_seconds, 2),
                     "final_loss": round(running or 0.0, 4), "device": device, "quantized_4bit": quantized}
    calibration = Calibration()
    if eval_set:
        margins = score_margins(model, tokenizer, [(r.question, r.answer, r.page_text) for r in eval_set], fmt)
        labels = [r.relevance for r in eval_set]
        raw = [Calibration().probability(m) for m in margins]
        calibration = fit_calibration(margins, labels)
        calibrated = [calibration.probability(m) for m in margins]
        metrics["held_out"] = classification_metrics(labels, raw)
        metrics["held_out_calibrated"] = classification_metrics(labels, calibrated)
        log("held-out: " + json.dumps(metrics["held_out"]))

    metadata = ModelMetadata(
        base_model=base_model,
        input_format=fmt,
        calibration=calibration,
        metrics=metrics,
        extra={
            "data_sha256": data_sha256,
            "train_records": len(train_set),
            "eval_records": len(eval_set),
            "held_out_documents": sorted(held_out_docs),
            "params": asdict(params),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tokenizer": base_model,
        },
    )
    _save_atomically(model, metadata, Path(out_dir))
    log(f"model written to {out_dir}")
    return metadata


def _save_atomically(model, metadata: ModelMetadata, out_dir: Path) -> None:
    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        for extra in ("README.md",):  # PEFT writes a model card we do not need
            (tmp / extra).unlink(missing_ok=True)
        adapter_config = tmp / "adapter_config.json"
        if adapter_config.exists():
            # PEFT records the resolved base path (a site-packages path of this
            # machine); keep the portable name the metadata uses instead
            config = json.loads(adapter_config.read_text())
            config["base_model_name_or_path"] = metadata.base_model
            adapter_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        metadata.write(tmp)

    replace_directory(out_dir, write)


def output_problem(out_dir: Path) -> str | None:
    """Why a model cannot be written to ``out_dir`` (None: it can): a model replaces the
    whole folder, so one that holds files but no model is refused (``--out .`` or a
    home folder would have been deleted with it)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        return f"--out {out_dir} is a file: name a folder for the model"
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / METADATA_FILE).is_file():
        return (f"--out {out_dir} holds files but no model ({METADATA_FILE}), and a model replaces the whole "
                "folder: name a new or empty folder, or a model's to replace it")
    return None


def replace_directory(out_dir: Path, write: Callable[[Path], None]) -> None:
    """``write`` a model into a sibling temporary directory, then rename it to ``out_dir``:
    an interrupted run never leaves a half-written model where a reranker would load it,
    and no file of a model written there before stays beside the new one's. TrainingError
    where ``out_dir`` holds something else (``output_problem``)."""
    problem = output_problem(out_dir)
    if problem:
        raise TrainingError(problem)
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        write(tmp)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}-old-{int(time.time())}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
