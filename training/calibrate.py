"""Calibrate a trained classifier on labelled first-stage pools.

`evidentia train` fits Platt scaling of the model's margin on held-out records.
This step refits the calibration on what the reranker actually sees: each labelled
query's first-stage pool (BM25 and/or hybrid), every page scored, its label known.
It fits p = sigmoid(a * margin + rank_weight * ln(rank) + b), so the probability is
the chance that a page is relevant given both the model's judgement and where the
first stage put it. On financebench a MiniLM classifier trained on 34 queries
ranked worse than BM25 alone, and combined with its rank better than either
(docs/BENCHMARKS.md, section 3). The probability still ranks the pages and the
threshold still applies to it; only the calibration (in the model's metadata) changes.

A features model's margin is its final logit z, read as when it reranks (with the
page's whole document: document features and document gap); the fit a * z + b
(never the rank) is folded into its weights, which is exactly a * z + b for every
page, as the document gap is linear in the logit and a > 0 keeps each document's
best page its best.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from evidentia.evaluation.metrics import expected_calibration_error, precision_at_k
from evidentia.evaluation.queries import EvalQuery
from evidentia.reranker.classifier_model import Calibration, ModelMetadata


class CalibrationError(ValueError):
    """The labelled pools cannot support a fit (e.g. no relevant page in any pool)."""


@dataclass(frozen=True)
class PoolPage:
    query_id: str
    margin: float
    rank: int  # 1-based place in the first-stage pool
    relevant: int


def fit_pool_calibration(pages: Sequence[PoolPage], regularisation: float = 1.0) -> Calibration:
    """Logistic regression of relevance on (margin, ln rank), on standardised
    features with a mild L2 penalty (few relevant pages per pool), mapped back to
    coefficients of the raw features."""
    labels = [p.relevant for p in pages]
    if len(set(labels)) < 2:
        raise CalibrationError(f"the pools hold {sum(labels)} relevant of {len(labels)} pages: "
                               "a calibration needs both relevant and non-relevant pages")
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    x = np.array([[p.margin, math.log(p.rank)] for p in pages], dtype=float)
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    # a constant feature (all margins equal, pools of one page) standardises to
    # zeros, which the L2 penalty gives weight 0; its std is rounding noise, not 0
    scale[scale < 1e-9 * (1.0 + abs(mean))] = np.inf
    model = LogisticRegression(C=regularisation).fit(np.nan_to_num((x - mean) / scale), labels)
    weights = model.coef_[0] / scale
    bias = float(model.intercept_[0] - (weights * mean).sum())
    return Calibration(a=float(weights[0]), b=bias, rank_weight=float(weights[1]))


@dataclass(frozen=True)
class PoolStats:
    """How a calibration does on the pools it was fitted on (in-sample, for the log)."""

    ece: float | None
    p_at_3: float

    def as_dict(self) -> dict:
        return {"ECE": None if self.ece is None else round(self.ece, 4), "P@3": round(self.p_at_3, 4)}


def pool_stats(pages: Sequence[PoolPage], calibration: Calibration) -> PoolStats:
    probs = [calibration.probability(p.margin, p.rank) for p in pages]
    by_query: dict[str, list[tuple[float, PoolPage]]] = {}
    for prob, page in zip(probs, pages):
        by_query.setdefault(page.query_id, []).append((prob, page))
    # P@3 of each pool ranked by probability (ties: first-stage order); (query, rank) names a page
    p3 = []
    for scored in by_query.values():
        ranking = [(page.query_id, page.rank) for _, page in sorted(scored, key=lambda sp: (-sp[0], sp[1].rank))]
        p3.append(precision_at_k(ranking, {(page.query_id, page.rank) for _, page in scored if page.relevant}, 3))
    return PoolStats(expected_calibration_error(probs, [p.relevant for p in pages]), sum(p3) / max(1, len(p3)))


def score_pools(reranker, pools: Iterable[tuple[EvalQuery, Sequence]],
                on_page: Callable[[int], None] | None = None) -> list[PoolPage]:
    """Margins of every page of every pool. ``reranker``: a ClassifierReranker
    (attached to the index, a features model reads each page with its document, as
    when it reranks); ``pools``: (query, its first-stage candidates in order). A
    page in the pools of two stages for the same query is scored once."""
    out: list[PoolPage] = []
    known: dict[tuple[str, str, int], float] = {}
    for query, candidates in pools:
        todo = [c for c in candidates if (query.id, c.doc_id, c.page) not in known]
        if todo:
            margins = reranker.pool_margins(query.question, query.answer, todo)
            known.update(((query.id, c.doc_id, c.page), m) for c, m in zip(todo, margins))
        out.extend(PoolPage(query.id, known[(query.id, c.doc_id, c.page)], rank,
                            int((c.doc_id, c.page) in query.relevant))
                   for rank, c in enumerate(candidates, start=1))
        if on_page is not None:
            on_page(len(candidates))
    return out


@dataclass(frozen=True)
class CalibrationResult:
    calibration: Calibration
    previous: PoolStats
    fitted: PoolStats
    queries: int
    pages: int
    relevant: int


def calibrate(model_dir: Path, pages: Sequence[PoolPage], stages: Sequence[str], queries_source: str = "",
              regularisation: float = 1.0) -> CalibrationResult:
    """Fit on scored pool pages and write the calibration into the model's metadata."""
    model_dir = Path(model_dir)
    metadata = ModelMetadata.read(model_dir)
    features_kind = metadata.extra.get("kind") == "features"
    # a features model's probability must stay a property of the page: the margin
    # (its logit) is rescaled, the place in the pool never enters the fit (the
    # stats below still need it: (query, place) names a page)
    fitted_on = [PoolPage(p.query_id, p.margin, 1, p.relevant) for p in pages] if features_kind else pages
    calibration = fit_pool_calibration(fitted_on, regularisation)
    if calibration.a < 0 or (features_kind and calibration.a == 0):
        # a < 0 would rank the pages the model finds least relevant first (folded into
        # a features model's weights, every document's order reversed; a = 0 there would
        # leave no order at all); a LoRA model with a = 0 is ranked by its place alone
        raise CalibrationError(f"on these pools the model's probability does not rise with relevance "
                               f"(fitted slope {calibration.a:.3f}): the model is left as it was")
    previous = Calibration() if features_kind else metadata.calibration
    result = CalibrationResult(
        calibration=calibration,
        previous=pool_stats(pages, previous),
        fitted=pool_stats(pages, calibration),
        queries=len({p.query_id for p in pages}),
        pages=len(pages),
        relevant=sum(p.relevant for p in pages),
    )
    if features_kind:
        model = metadata.extra["feature_model"]
        model["weights"] = [calibration.a * w for w in model["weights"]]
        model["bias"] = calibration.a * model["bias"] + calibration.b
    else:
        metadata.calibration = calibration
    metadata.extra["pool_calibration"] = {
        "stages": list(stages),
        "queries": result.queries,
        "pages": result.pages,
        "relevant": result.relevant,
        "source": queries_source,
        "in_sample": {"before": result.previous.as_dict(), "after": result.fitted.as_dict()},
    }
    metadata.write(model_dir)
    return result
