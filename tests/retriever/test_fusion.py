"""Weighted reciprocal-rank fusion (retriever/fusion.py) on hand-made rankings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from evidentia.config import ConfigError, Settings
from evidentia.records import Candidate
from evidentia.config import STAGES as FIRST_STAGES
from evidentia.engine import RunConfig as PipelineConfig
from evidentia.engine import parse_config
from evidentia.retriever.fusion import DEFAULT_K, MIN_POOL_FOR_LEADERS, keep_each_first, rrf


def c(doc: str, page: int, score: float = 0.0, snippet: str = "", text: str = "") -> Candidate:
    return Candidate(doc_id=doc, page=page, score=score, text=text or f"{doc} page {page}", snippet=snippet)


def keys(cands):
    return [(x.doc_id, x.page) for x in cands]


def test_scores_are_sums_of_weighted_reciprocal_ranks():
    bm25 = [c("a", 1), c("a", 2), c("a", 3)]
    dense = [c("a", 3), c("a", 1), c("a", 4)]
    fused = rrf([bm25, dense], k=60)
    got = {(x.doc_id, x.page): x.score for x in fused}
    assert got == pytest.approx({
        ("a", 1): 1 / 61 + 1 / 62,
        ("a", 3): 1 / 63 + 1 / 61,
        ("a", 2): 1 / 62,
        ("a", 4): 1 / 63,
    })
    # a1 (ranks 1, 2) beats a3 (ranks 3, 1): 1/61 + 1/62 > 1/63 + 1/61
    assert keys(fused) == [("a", 1), ("a", 3), ("a", 2), ("a", 4)]
    assert DEFAULT_K == 60


def test_small_k_favours_top_ranks():
    bm25 = [c("a", 1), c("a", 2), c("a", 3)]
    dense = [c("a", 2), c("a", 3), c("a", 1)]
    # k = 0: a1 = 1 + 1/3, a2 = 1/2 + 1, a3 = 1/3 + 1/2
    fused = rrf([bm25, dense], k=0)
    assert keys(fused) == [("a", 2), ("a", 1), ("a", 3)]
    assert [x.score for x in fused] == pytest.approx([1.5, 4 / 3, 5 / 6])


def test_weights():
    bm25 = [c("a", 1), c("a", 2)]
    dense = [c("a", 2), c("a", 1)]
    # equal weights: a perfect tie, broken by page
    assert keys(rrf([bm25, dense], [1, 1])) == [("a", 1), ("a", 2)]
    assert keys(rrf([bm25, dense], [1, 2])) == [("a", 2), ("a", 1)]
    assert keys(rrf([bm25, dense], [2, 1])) == [("a", 1), ("a", 2)]
    scored = rrf([bm25, dense], [0.5, 2.0], k=10)
    assert {(x.doc_id, x.page): x.score for x in scored} == pytest.approx(
        {("a", 1): 0.5 / 11 + 2 / 12, ("a", 2): 0.5 / 12 + 2 / 11})
    # weight 0 leaves a ranking out, pages and all
    only_bm25 = rrf([bm25, [c("z", 9)]], [1, 0])
    assert keys(only_bm25) == [("a", 1), ("a", 2)]


def test_ties_are_broken_by_doc_id_then_page():
    # disjoint lists of equal weight: rank 1 of each ties, then rank 2 of each
    first = [c("b", 4), c("b", 1)]
    second = [c("a", 7), c("a", 2)]
    assert keys(rrf([first, second])) == [("a", 7), ("b", 4), ("a", 2), ("b", 1)]
    # the same inputs in the other order give the same output
    assert keys(rrf([second, first])) == keys(rrf([first, second]))


def test_disjoint_lists_interleave():
    bm25 = [c("a", 1), c("a", 2), c("a", 3)]
    dense = [c("a", 10), c("a", 20), c("a", 30)]
    fused = rrf([bm25, dense], [1.0, 1.0])
    assert keys(fused) == [("a", 1), ("a", 10), ("a", 2), ("a", 20), ("a", 3), ("a", 30)]
    assert len(fused) == 6


def test_overlap_lifts_pages_both_rankings_like():
    bm25 = [c("a", 1), c("a", 2), c("a", 3), c("a", 4)]
    dense = [c("a", 9), c("a", 8), c("a", 4)]
    fused = keys(rrf([bm25, dense]))
    # a4 is 4th and 3rd: its sum beats every page found by one ranking only
    assert fused[0] == ("a", 4)


def test_top_k_cuts_the_fused_list():
    bm25 = [c("a", i) for i in range(1, 11)]
    dense = [c("a", i) for i in range(10, 0, -1)]
    assert len(rrf([bm25, dense], top_k=3)) == 3
    assert rrf([bm25, dense], top_k=0) == []
    assert len(rrf([bm25, dense], top_k=100)) == 10


def test_empty_lists():
    assert rrf([]) == []
    assert rrf([[], []]) == []
    only = [c("a", 2), c("a", 1)]
    assert keys(rrf([only, []])) == [("a", 2), ("a", 1)]
    assert keys(rrf([[], only])) == [("a", 2), ("a", 1)]
    assert [x.score for x in rrf([[], only])] == pytest.approx([1 / 61, 1 / 62])


def test_duplicates_in_one_ranking_count_once_at_their_best_rank():
    fused = rrf([[c("a", 1), c("a", 1), c("a", 2)]])
    assert keys(fused) == [("a", 1), ("a", 2)]
    assert [x.score for x in fused] == pytest.approx([1 / 61, 1 / 63])


def test_candidates_keep_text_and_the_first_snippet():
    bm25 = [c("a", 1, score=12.5, snippet="keyword snippet", text="page one")]
    dense = [c("a", 1, score=0.8, snippet="", text="page one"), c("a", 2, score=0.7, text="page two")]
    fused = rrf([bm25, dense])
    assert fused[0].snippet == "keyword snippet" and fused[0].text == "page one"
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 61)  # the fused score, not BM25's
    # a snippet missing from the first ranking is taken from a later one
    fused = rrf([[c("a", 3)], [c("a", 3, snippet="from dense")]])
    assert fused[0].snippet == "from dense"


def test_bad_arguments():
    with pytest.raises(ValueError):
        rrf([[c("a", 1)], [c("a", 2)]], [1.0])
    with pytest.raises(ValueError):
        rrf([[c("a", 1)]], [-1.0])
    with pytest.raises(ValueError):
        rrf([[c("a", 1)]], k=-1)


# --- configurations and settings that name the stages --------------------------------
def test_first_stages_and_configuration_strings():
    assert FIRST_STAGES == ("bm25", "dense", "hybrid")
    assert parse_config("hybrid") == PipelineConfig(stage="hybrid")
    assert parse_config("dense") == PipelineConfig(stage="dense")
    assert parse_config("hybrid+classifier@0.15") == PipelineConfig("hybrid", "classifier", 0.15)
    assert parse_config("hybrid+classifier@0.15").label == "hybrid+classifier@0.15"
    assert parse_config("dense+llm").label == "dense+llm"
    assert parse_config("classifier").stage == "bm25"
    with pytest.raises(ConfigError, match="first stage"):
        parse_config("sparse+classifier")


def test_settings_of_the_first_stage():
    s = Settings.from_env({})
    assert (s.stage, s.dense, s.rrf_k, s.hybrid_weights, s.hybrid_depth) == ("hybrid", True, 60, (1.0, 1.0), 2)  # issue #14: hybrid by default
    assert s.dense_model == "all-MiniLM-L6-v2"
    s = Settings.from_env({"EVIDENTIA_STAGE": "Hybrid", "EVIDENTIA_DENSE": "off", "EVIDENTIA_HYBRID_WEIGHTS": "1, 0.5",
                           "EVIDENTIA_RRF_K": "20", "EVIDENTIA_DENSE_MODEL": "/models/multilingual"})
    assert (s.stage, s.dense, s.hybrid_weights, s.rrf_k, s.dense_model) == (
        "hybrid", False, (1.0, 0.5), 20, "/models/multilingual")
    for name, value in [("EVIDENTIA_STAGE", "sparse"), ("EVIDENTIA_DENSE", "maybe"),
                        ("EVIDENTIA_HYBRID_WEIGHTS", "1"), ("EVIDENTIA_HYBRID_WEIGHTS", "0,0"),
                        ("EVIDENTIA_HYBRID_WEIGHTS", "-1,1"), ("EVIDENTIA_RRF_K", "0")]:
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: value})


def test_each_ranking_s_first_page_stays_in_the_pool():
    """BM25's best page, absent from the dense list, earns 1/61 and falls below every
    page both lists hold: it takes the place of the lowest of them, and the pool keeps
    the fused order (docs/BENCHMARKS.md 8ap, P1)."""
    shared = [c("a", i) for i in range(1, 9)]
    bm25 = [c("a", 99)] + shared
    dense = shared + [c("a", 77)]
    fused = rrf([bm25, dense])
    assert ("a", 99) not in keys(fused[:5])  # the fusion alone leaves it out of a pool of 5
    pool = keep_each_first(fused, [bm25, dense], top_k=5)
    assert keys(pool) == [("a", 1), ("a", 2), ("a", 3), ("a", 4), ("a", 99)]
    assert [p.score for p in pool] == sorted((p.score for p in pool), reverse=True)
    # dense's first page is in the pool already; a ranking of weight 0 has no first page
    assert keys(keep_each_first(rrf([bm25, dense], [0.0, 1.0]), [bm25, dense], [0.0, 1.0], top_k=5)) == \
        keys(rrf([bm25, dense], [0.0, 1.0], top_k=5))
    # both first pages missing: each takes a place, the rest stays fused
    lone = [c("b", 1)] + shared
    both = keep_each_first(rrf([bm25, lone]), [bm25, lone], top_k=6)
    assert {("a", 99), ("b", 1)} <= set(keys(both)) and len(both) == 6
    # a pool too small for leaders, and one that already holds everything, are the fused order
    small = MIN_POOL_FOR_LEADERS - 1
    assert keys(keep_each_first(fused, [bm25, dense], top_k=small)) == keys(fused[:small])
    assert keys(keep_each_first(fused, [bm25, dense], top_k=100)) == keys(fused)


def test_the_hybrid_stage_keeps_each_ranking_s_first_page():
    """The joiner of the hybrid stage applies keep_each_first to its pool."""
    from evidentia.retriever.stages import FirstStage, HybridRetriever

    shared = [c("a", i) for i in range(1, 30)]

    class Fixed(FirstStage):
        def __init__(self, ranking):
            self.ranking = ranking

        def retrieve(self, query, doc_ids, top_k, timings=None):
            return self.ranking[:top_k]

    hybrid = HybridRetriever(Fixed([c("a", 99)] + shared), Fixed(shared))
    assert keys(hybrid.retrieve(None, ["a"], 5)) == [("a", 1), ("a", 2), ("a", 3), ("a", 4), ("a", 99)]


def test_a_fused_page_names_every_stage_that_ranked_it():
    bm25 = [replace(c("a", 1), found_by=("bm25",)), replace(c("a", 2), found_by=("bm25",))]
    dense = [replace(c("a", 2), found_by=("dense",)), replace(c("a", 3), found_by=("dense",))]
    fused = {(x.doc_id, x.page): x.found_by for x in rrf([bm25, dense])}
    assert fused == {("a", 1): ("bm25",), ("a", 2): ("bm25", "dense"), ("a", 3): ("dense",)}
