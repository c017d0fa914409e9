"""A transformer encoder on ONNX Runtime with int8 weights: the CPU inference path.

On a laptop CPU the torch model is the slow part of indexing (98 % of the time)
and its import is most of a search's start-up. This module runs the same
weights through ONNX Runtime instead:

- ``ensure_onnx_model`` exports a Hugging Face model directory once (torch and
  transformers are imported only then), quantizes its weights to int8
  (``quantize_dynamic``: weights int8, activations quantized on the fly, which
  suits the AVX-512 VNNI / AVX2 kernels of ONNX Runtime), and caches the file
  beside the model, or under a cache directory when the model's own directory
  is read-only. The file name holds a key made of the weights' size and mtime,
  the export format and the onnxruntime version, so a retrained model or an
  upgraded runtime gets a new export instead of a stale one.
- ``OnnxEncoder`` loads that file in an ``InferenceSession`` and tokenizes with
  the model's ``tokenizer.json`` through the ``tokenizers`` library directly:
  neither torch nor transformers is imported, so a search starts in well under
  a second.

``kind="encoder"`` exports the last hidden state (sentence embeddings pool it),
``kind="classifier"`` the logits of a sequence-classification head (the
classifier reranker can reuse this module).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

# Bump when the export changes (inputs, outputs, opset, quantization) so caches renew.
EXPORT_FORMAT = 3
OPSET = 17
KINDS = ("encoder", "classifier")


class OnnxExportError(RuntimeError):
    """The model cannot be exported or run with ONNX Runtime (the torch path still can)."""


def _weights_files(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.iterdir()
                  if p.is_file() and (p.suffix in (".safetensors", ".bin") or p.name == "config.json"))


def cache_key(model_dir: Path, kind: str, quantize: bool) -> str:
    """Names one export: the weights (size + mtime, cheap to read at every start),
    the export format and the onnxruntime version."""
    import onnxruntime

    h = hashlib.sha256()
    for p in _weights_files(model_dir):
        st = p.stat()
        h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    h.update(f"{kind}:{quantize}:{EXPORT_FORMAT}:{OPSET}:{onnxruntime.__version__}".encode())
    return h.hexdigest()[:16]


def _writable(directory: Path) -> bool:
    return directory.is_dir() and os.access(directory, os.W_OK | os.X_OK)


def onnx_model_path(model_dir: Path, kind: str = "encoder", quantize: bool = True,
                    cache_dir: Path | None = None) -> Path:
    """Where the export of ``model_dir`` lives: ``<model_dir>/onnx/`` when that is
    writable, else ``<cache_dir>/<hash of the model path>/``."""
    model_dir = Path(model_dir).resolve()
    name = f"{kind}-{'int8' if quantize else 'fp32'}-{cache_key(model_dir, kind, quantize)}.onnx"
    beside = model_dir / "onnx"
    if _writable(beside) or (not beside.exists() and _writable(model_dir)):
        return beside / name
    if cache_dir is None:
        raise OnnxExportError(f"{model_dir} is read-only and no cache directory was given for its ONNX export")
    where = hashlib.sha256(str(model_dir).encode()).hexdigest()[:12]
    return Path(cache_dir) / "onnx" / f"{model_dir.name}-{where}" / name


def ensure_onnx_model(model_dir: Path, kind: str = "encoder", quantize: bool = True,
                      cache_dir: Path | None = None) -> Path:
    """The cached export of ``model_dir`` (exported now if missing). Written to a
    temporary file and renamed, so a concurrent process never reads half a file."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    target = onnx_model_path(model_dir, kind, quantize, cache_dir)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".export-") as tmp:
        fp32 = Path(tmp) / "model.onnx"
        _export(Path(model_dir), fp32, kind)
        final = fp32
        if quantize:
            final = Path(tmp) / "model.int8.onnx"
            _quantize(fp32, final)
        os.replace(final, target)
    # Older exports of the same model (another key) are dead weight.
    for old in target.parent.glob(f"{kind}-{'int8' if quantize else 'fp32'}-*.onnx"):
        if old != target:
            old.unlink(missing_ok=True)
    return target


def _export(model_dir: Path, dest: Path, kind: str) -> None:
    """torch.onnx.export of the model, batch and sequence axes dynamic."""
    try:
        import torch
        from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification
    except ImportError as exc:  # pragma: no cover
        raise OnnxExportError(f"exporting to ONNX needs torch and transformers: {exc}") from None
    import warnings

    from transformers.utils import logging as hf_logging

    # The tracer's warnings and the weight-loading bar mean nothing to a user who
    # asked for a search; the export is checked against torch by the tests.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            _export_quiet(model_dir, dest, kind, torch, AutoConfig, AutoModel, AutoModelForSequenceClassification)
        finally:
            if bar:
                hf_logging.enable_progress_bar()


def _export_quiet(model_dir: Path, dest: Path, kind: str, torch, AutoConfig, AutoModel,
                  AutoModelForSequenceClassification) -> None:
    loader = AutoModel if kind == "encoder" else AutoModelForSequenceClassification
    config = AutoConfig.from_pretrained(str(model_dir))
    try:
        # Eager attention exports as plain MatMul/Softmax, which ONNX Runtime fuses and quantizes best.
        model = loader.from_pretrained(str(model_dir), attn_implementation="eager")
    except (TypeError, ValueError):
        model = loader.from_pretrained(str(model_dir))
    model.eval()
    with_types = getattr(config, "type_vocab_size", 0) and "token_type_ids" in _forward_params(model)
    output = "last_hidden_state" if kind == "encoder" else "logits"

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kwargs["token_type_ids"] = token_type_ids
            return getattr(self.inner(**kwargs), output)

    ids = torch.ones((2, 8), dtype=torch.long)
    inputs = (ids, torch.ones_like(ids)) + ((torch.zeros_like(ids),) if with_types else ())
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if with_types else [])
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes[output] = {0: "batch", 1: "sequence"} if kind == "encoder" else {0: "batch"}
    try:
        with torch.inference_mode():
            torch.onnx.export(Wrapped(model), inputs, str(dest), input_names=names, output_names=[output],
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    except Exception as exc:  # unsupported ops, missing `onnx` package: the torch path remains
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise OnnxExportError(f"cannot export {model_dir.name} to ONNX: {first}") from None


def _forward_params(model) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


def _quantize(src: Path, dest: Path) -> None:
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:  # pragma: no cover
        raise OnnxExportError(f"int8 quantization needs the onnx package: {exc}") from None
    import logging

    # quantize_dynamic logs a "consider pre-processing" hint at WARNING on every export.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    import onnx

    # Only MatMuls with a constant weight are quantized (activation x activation
    # products inside attention stay fp32), per output channel; the feed-forward
    # output projections stay fp32 too: their inputs (after GELU) are heavy-tailed,
    # and quantizing them cost most of the accuracy. Measured on MiniLM with
    # generated multilingual text: cosine to the torch vectors 0.93-0.96 with
    # ORT's defaults, 0.986-0.992 per-channel, > 0.993 with these projections
    # kept, which is 1.3 times slower than all-int8 but still twice fp32.
    # Weights in 7 bits (reduce_range): on x86 CPUs without VNNI (AVX2 only, e.g. an AMD
    # EPYC VM) ONNX Runtime multiplies uint8 activations by int8 weights with an
    # instruction that saturates its 16-bit sums; with 8-bit weights one generated
    # text's vector fell to cosine 0.962 with torch's there. 7-bit: 0.990 or more.
    graph = onnx.load(str(src), load_external_data=False).graph
    keep_fp32 = [n.name for n in graph.node if n.op_type == "MatMul" and _is_ffn_output(n.name)]
    try:
        quantize_dynamic(str(src), str(dest), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                         nodes_to_exclude=keep_fp32, extra_options={"MatMulConstBOnly": True})
    finally:
        root.setLevel(level)


def _is_ffn_output(node_name: str) -> bool:
    """The feed-forward down projection of a layer: BERT-likes' ``layer.N/output/dense``,
    Llama-likes' ``mlp/down_proj``."""
    name = node_name.lower()
    return ("/output/dense/" in name and "attention" not in name) or "down_proj" in name


def session_options(threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle worker threads spin by default; on a small shared machine that burns the
    # core another process (or the PDF extraction) needs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options


class Tokenized:
    """The ids of one text (no special tokens) with their character offsets."""

    __slots__ = ("ids", "offsets")

    def __init__(self, ids: list[int], offsets: list[tuple[int, int]]) -> None:
        self.ids = ids
        self.offsets = offsets


class OnnxEncoder:
    """Runs an exported encoder; tokenizes with ``tokenizer.json`` (no torch, no transformers)."""

    def __init__(self, onnx_path: Path, tokenizer_path: Path, threads: int = 1) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.path = Path(onnx_path)
        self.session = ort.InferenceSession(str(onnx_path), session_options(threads),
                                            providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        # Windows and batches are cut here: the file's own truncation/padding would cut again.
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.prefix, self.suffix = _special_tokens(self.tokenizer)
        self.pad_id = _pad_id(self.tokenizer)
        self.threads = threads

    @classmethod
    def from_model_dir(cls, model_dir: Path, kind: str = "encoder", threads: int = 1, quantize: bool = True,
                       cache_dir: Path | None = None) -> "OnnxEncoder":
        model_dir = Path(model_dir)
        tokenizer = model_dir / "tokenizer.json"
        if not tokenizer.is_file():
            raise OnnxExportError(f"{model_dir} has no tokenizer.json (a fast tokenizer is needed for ONNX)")
        return cls(ensure_onnx_model(model_dir, kind, quantize, cache_dir), tokenizer, threads)

    # -- tokens ------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> list[Tokenized]:
        """Ids and character offsets of each text, without special tokens."""
        encs = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [Tokenized(e.ids, e.offsets) for e in encs]

    def with_specials(self, ids: Sequence[int]) -> list[int]:
        return [*self.prefix, *ids, *self.suffix]

    # -- inference ---------------------------------------------------------------
    def run(self, sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """(first output, attention mask) for sequences already holding their special
        tokens, padded to the longest; the caller batches them."""
        longest = max(len(s) for s in sequences)
        ids = np.full((len(sequences), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(sequences), longest), dtype=np.int64)
        for row, seq in enumerate(sequences):
            ids[row, :len(seq)] = seq
            mask[row, :len(seq)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        return self.session.run(None, feeds)[0], mask

    def embed(self, sequences: Sequence[Sequence[int]], batch_size: int = 32, pooling: str = "mean",
              normalize: bool = True) -> np.ndarray:
        """Pooled (and L2-normalised) vectors, rows in input order. Sequences are run
        sorted by length so that a batch pads little."""
        out: np.ndarray | None = None
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        for lo in range(0, len(order), batch_size):
            rows = order[lo:lo + batch_size]
            hidden, mask = self.run([sequences[i] for i in rows])
            pooled = pool(hidden, mask, pooling)
            if out is None:
                out = np.zeros((len(sequences), pooled.shape[1]), dtype=np.float32)
            out[rows] = pooled
        if out is None:
            return np.zeros((0, 0), dtype=np.float32)
        if normalize:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            out /= np.where(norms == 0, 1.0, norms)
        return out


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str = "mean") -> np.ndarray:
    """Sentence-transformers' pooling of token states: ``mean`` over real tokens, or ``cls``."""
    if mode == "cls":
        return hidden[:, 0].astype(np.float32)
    if mode == "mean":
        m = mask[..., None].astype(np.float32)
        return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    raise ValueError(f"pooling {mode!r} is not supported on the ONNX path (mean or cls)")


def _special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after one sequence ([CLS] / [SEP]
    for BERT, <s> / </s> for RoBERTa), found by encoding a probe with and without them."""
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            return full[:start], full[start + len(bare):]
    return [], []


def _pad_id(tokenizer) -> int:
    for token in ("[PAD]", "<pad>", "<|pad|>"):
        tid = tokenizer.token_to_id(token)
        if tid is not None:
            return tid
    return 0


def sentence_transformers_layout(model_dir: Path) -> dict:
    """What the ONNX path must reproduce of a sentence-transformers directory:
    pooling mode, normalisation, max_seq_length, prompts. Raises OnnxExportError
    for modules it does not implement (Dense projections, other poolings), so the
    caller keeps the torch path for such models."""
    model_dir = Path(model_dir)
    layout = {"pooling": "mean", "normalize": False, "max_seq_length": None, "prompts": {}}
    modules_file = model_dir / "modules.json"
    modules = json.loads(modules_file.read_text()) if modules_file.is_file() else []
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind == "Transformer":
            continue
        if kind == "Pooling":
            cfg_file = model_dir / module.get("path", "") / "config.json"
            cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
            modes = [k for k, v in cfg.items() if k.startswith("pooling_mode") and v]
            mode = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}.get(
                modes[0] if len(modes) == 1 else "", None)
            if mode is None:
                raise OnnxExportError(f"pooling {modes} is not supported on the ONNX path")
            layout["pooling"] = mode
        elif kind == "Normalize":
            layout["normalize"] = True
        else:
            raise OnnxExportError(f"the module {kind} is not supported on the ONNX path")
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.is_file():
        layout["max_seq_length"] = json.loads(st_config.read_text()).get("max_seq_length")
    prompts_file = model_dir / "config_sentence_transformers.json"
    if prompts_file.is_file():
        layout["prompts"] = json.loads(prompts_file.read_text()).get("prompts") or {}
    return layout
