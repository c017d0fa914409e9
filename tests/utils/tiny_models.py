"""Tiny models built from a config, for tests that must not touch a model hub.

Two kinds, each a directory loadable with ``AutoTokenizer.from_pretrained`` and
``AutoModelForSequenceClassification.from_pretrained``:

- an encoder (BERT architecture) with a word-level tokenizer that has
  [PAD] [UNK] [CLS] [SEP] [MASK];
- a decoder (Llama architecture) whose tokenizer has <s> and </s> but no pad
  token, as Llama ships, so the code's pad-token handling is exercised.

One token per word (lower-cased, punctuation split off), so a test can reason
about windows in words. Words outside ``VOCAB`` become the unknown token.

Also: small synthetic training records (distinct words for relevant and
non-relevant pages) and ``trained_model``, which trains a tiny model once per
test session and hands the same directory to every test module that asks.
"""

from __future__ import annotations

from pathlib import Path

import torch

# Tiny matrices gain nothing from intra-op threads, and on a busy machine two
# threads per op make training a tiny model 50 times slower.
torch.set_num_threads(1)

# Words the tests use. Relevant pages talk about emissions, irrelevant ones
# about the canteen; the filler words pad long pages.
RELEVANT_WORDS = ["carbon", "emissions", "scope", "tonnes", "greenhouse", "gas", "reduced", "climate"]
IRRELEVANT_WORDS = ["canteen", "football", "picnic", "music", "garden", "lunch", "holiday", "party"]
FILLER_WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
QUESTION = "what were the carbon emissions"
ANSWER = "emissions were reduced"
OTHER_WORDS = [
    "what", "were", "the", "our", "in", "of", "and", "a", "is", "we", "to", "was", "by", "on", "for", "page",
    "report", "company", "total", "year", "this", "all", "2023", "12", "5", "%", ".", ",", "?", ":", "-",
]
VOCAB_WORDS = list(dict.fromkeys(RELEVANT_WORDS + IRRELEVANT_WORDS + FILLER_WORDS + OTHER_WORDS))

ENCODER_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DECODER_SPECIALS = ["<unk>", "<s>", "</s>"]


def _word_tokenizer(specials: list[str], unk: str):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(specials + VOCAB_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return tok


def write_tiny_encoder(directory: Path, seed: int = 0) -> Path:
    """A 2-layer BERT (hidden 32) with a two-label head and its word-level tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_word_tokenizer(ENCODER_SPECIALS, "[UNK]"),
        unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        model_max_length=512,
    )
    tokenizer.save_pretrained(str(directory))
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512, num_labels=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(str(directory), safe_serialization=True)
    return directory


def write_tiny_llama(directory: Path, seed: int = 0) -> Path:
    """A 2-layer Llama (hidden 32, 4 heads, 2 kv heads) with a two-label head;
    its tokenizer has <s>/</s> but no pad token and the config no pad_token_id."""
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_word_tokenizer(DECODER_SPECIALS, "<unk>"),
        unk_token="<unk>", bos_token="<s>", eos_token="</s>", model_max_length=512,
    )
    assert tokenizer.pad_token is None
    tokenizer.save_pretrained(str(directory))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512, num_labels=2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).save_pretrained(str(directory), safe_serialization=True)
    return directory


WRITERS = {"encoder": write_tiny_encoder, "llama": write_tiny_llama}


def relevant_page(i: int = 0, words: int = 12) -> str:
    body = [RELEVANT_WORDS[(i + k) % len(RELEVANT_WORDS)] for k in range(words)]
    return "our " + " ".join(body) + " ."


def irrelevant_page(i: int = 0, words: int = 12) -> str:
    body = [IRRELEVANT_WORDS[(i + k) % len(IRRELEVANT_WORDS)] for k in range(words)]
    return "our " + " ".join(body) + " ."


def filler(n: int, offset: int = 0) -> str:
    return " ".join(FILLER_WORDS[(offset + k) % len(FILLER_WORDS)] for k in range(n))


def training_records(n_docs: int = 6, per_doc: int = 2):
    """Records over ``n_docs`` documents, each with ``per_doc`` relevant and
    ``per_doc`` non-relevant pages: every held-out split has both classes."""
    from evidentia.training.dataset import TrainingRecord

    out = []
    for d in range(n_docs):
        for k in range(per_doc):
            out.append(TrainingRecord(QUESTION, ANSWER, relevant_page(d + k), 1, f"doc{d}", 2 * k + 1, "test"))
            out.append(TrainingRecord(QUESTION, ANSWER, irrelevant_page(d + k), 0, f"doc{d}", 2 * k + 2, "test"))
    return out


_BASES: dict[str, Path] = {}
_TRAINED: dict[str, tuple[Path, Path, object]] = {}


def base_model(kind: str, tmp_path_factory) -> Path:
    """The untrained tiny model of ``kind`` ("encoder" or "llama"), written once per session."""
    if kind not in _BASES:
        _BASES[kind] = WRITERS[kind](tmp_path_factory.mktemp(f"tiny-{kind}-base"))
    return _BASES[kind]


def trained_model(kind: str, tmp_path_factory):
    """(base dir, trained dir, metadata): ``evidentia.training.train.train`` run once
    per session on the tiny model with default LoRA settings, 20 optimizer steps
    (enough for the distinct words to separate the classes, so the calibration is
    moderate) and a third of the documents held out (so the calibration is fitted)."""
    if kind not in _TRAINED:
        from evidentia.training.train import TrainParams, train

        base = base_model(kind, tmp_path_factory)
        out = tmp_path_factory.mktemp(f"tiny-{kind}-trained") / "model"
        params = TrainParams(max_steps=20, eval_fraction=0.34, learning_rate=1e-2, warmup_ratio=0.0)
        metadata = train(training_records(), str(base), out, params, data_sha256="0" * 64,
                         log=lambda _m: None, progress=False)
        _TRAINED[kind] = (base, out, metadata)
    return _TRAINED[kind]
