"""Reciprocal-rank fusion of first-stage rankings (BM25 and dense) into one pool.

A page at 1-based rank ``r`` of ranking ``i`` earns ``weights[i] / (k + r)``;
its fused score is the sum over the rankings it appears in (Cormack et al.,
2009, with per-ranking weights). Only ranks count, so BM25 scores and cosines
need no common scale.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from evidentia.config import declared_default
from evidentia.records import Candidate

DEFAULT_K = declared_default("rrf_k")


def rrf(rankings: Sequence[Sequence[Candidate]], weights: Sequence[float] | None = None, k: float = DEFAULT_K,
        top_k: int | None = None) -> list[Candidate]:
    """Fuse ``rankings`` (each best first) into one list, best first, cut to
    ``top_k`` (None: every page that appears). A page is identified by (doc_id,
    page); a page listed twice in one ranking counts at its best rank there.
    The returned Candidates carry the fused score, and the text, language and
    snippet of the page's first appearance (the first ranking that has it, so
    with BM25 first its keyword snippet is kept; an empty snippet is filled from
    a later ranking), and the stages of every ranking that has it (``found_by``).
    Equal scores are ordered by doc id, then page. A ranking of weight 0 is
    ignored altogether."""
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weight(s) for {len(rankings)} ranking(s)")
    if any(w < 0 for w in weights):
        raise ValueError(f"weights must be >= 0, not {list(weights)}")
    if k < 0:
        raise ValueError(f"k must be >= 0, not {k}")
    scores: dict[tuple[str, int], float] = {}
    first: dict[tuple[str, int], Candidate] = {}
    for ranking, weight in zip(rankings, weights):
        if weight == 0:
            continue  # a ranking of weight 0 is left out, pages and all
        seen: set[tuple[str, int]] = set()
        for rank, cand in enumerate(ranking, start=1):
            key = (cand.doc_id, cand.page)
            if key in seen:
                continue
            seen.add(key)
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
            if key not in first:
                first[key] = cand
            else:
                known = first[key]
                found_by = known.found_by + tuple(s for s in cand.found_by if s not in known.found_by)
                first[key] = replace(known, snippet=known.snippet or cand.snippet, found_by=found_by)
    order = sorted(scores, key=lambda key: (-scores[key], key[0], key[1]))
    if top_k is not None:
        order = order[:max(0, top_k)]
    return [replace(first[key], score=scores[key]) for key in order]


# Below this pool size the pool is the fused order alone: a leader would take a quarter or
# more of it (a `--top-k 3` asks for the three best fused pages).
MIN_POOL_FOR_LEADERS = 4


def keep_each_first(fused: Sequence[Candidate], rankings: Sequence[Sequence[Candidate]],
                    weights: Sequence[float] | None = None, top_k: int | None = None) -> list[Candidate]:
    """The first ``top_k`` of ``fused`` (rrf's order, uncut), where the first page of each
    ranking (of weight > 0) that fell below them takes the place of the lowest one that is
    not itself such a page; the pool stays in fused order. A page first in BM25 and absent
    from dense's list earns 1/61, below every page in both lists' top 40 (about 2/70): on
    two reports searched together, or a 200-page filing, BM25's best page was out of the
    pool and no reranker could see it (docs/BENCHMARKS.md 8ap, candidate P1)."""
    if top_k is None or top_k >= len(fused):
        return list(fused)
    pool = list(fused[:max(0, top_k)])
    if top_k < MIN_POOL_FOR_LEADERS:
        return pool
    weights = [1.0] * len(rankings) if weights is None else weights
    leaders = {(r[0].doc_id, r[0].page) for r, w in zip(rankings, weights) if r and w > 0}
    in_pool = {(c.doc_id, c.page) for c in pool}
    missing = [c for c in fused[top_k:] if (c.doc_id, c.page) in leaders - in_pool]
    for leader in missing:
        lowest = max(i for i, c in enumerate(pool) if (c.doc_id, c.page) not in leaders)
        del pool[lowest]
        pool.append(leader)  # below every fused page kept: fused order
    return pool
