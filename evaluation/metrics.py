"""Ranking and calibration metrics: pure functions, no I/O.

A ranking is a list of ``(doc_id, page)`` keys, best first; ``relevant`` is the
set of keys judged relevant. Relevance is binary. A key repeated in a ranking
counts once (at its first position), so a buggy reranker cannot score twice
with the same page.

Metrics that are normalised by the relevant set (recall, nDCG, average
precision) or look for the first relevant page (reciprocal rank) are undefined
for a query without relevant pages: they return ``None`` and the aggregate
skips such queries, counting them. Precision is defined for every query.

scikit-learn (Brier score, AUROC) is imported only when those are computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Protocol, Sequence

Key = tuple[str, int]


def _check_k(k: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, not {k!r}")


def _gains(ranking: Sequence[Key], relevant: Iterable[Key]) -> list[int]:
    """1 for a relevant key at its first occurrence, else 0."""
    relevant = set(relevant)
    seen: set[Key] = set()
    gains = []
    for key in ranking:
        key = (key[0], key[1])
        gains.append(1 if key in relevant and key not in seen else 0)
        seen.add(key)
    return gains


def precision_at_k(ranking: Sequence[Key], relevant: Iterable[Key], k: int) -> float:
    """Relevant pages among the first ``k``, divided by ``k`` (even when fewer were returned)."""
    _check_k(k)
    return sum(_gains(ranking[:k], relevant)) / k


def recall_at_k(ranking: Sequence[Key], relevant: Iterable[Key], k: int) -> Optional[float]:
    """Share of the relevant pages found among the first ``k``; None without relevant pages."""
    _check_k(k)
    relevant = set(relevant)
    if not relevant:
        return None
    return sum(_gains(ranking[:k], relevant)) / len(relevant)


def reciprocal_rank(ranking: Sequence[Key], relevant: Iterable[Key]) -> Optional[float]:
    """1 / rank of the first relevant page, 0 when none was returned; None without relevant pages."""
    relevant = set(relevant)
    if not relevant:
        return None
    for rank, gain in enumerate(_gains(ranking, relevant), 1):
        if gain:
            return 1.0 / rank
    return 0.0


def ndcg_at_k(ranking: Sequence[Key], relevant: Iterable[Key], k: int) -> Optional[float]:
    """Binary-gain nDCG: sum of 1/log2(rank+1) over relevant pages in the top ``k``,
    divided by the same sum for an ideal ranking (all relevant pages first)."""
    _check_k(k)
    relevant = set(relevant)
    if not relevant:
        return None
    dcg = sum(g / math.log2(rank + 1) for rank, g in enumerate(_gains(ranking[:k], relevant), 1))
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(k, len(relevant)) + 1))
    return dcg / ideal


def average_precision(ranking: Sequence[Key], relevant: Iterable[Key]) -> Optional[float]:
    """Mean of precision@rank over the ranks of the relevant pages returned, divided by
    the number of relevant pages (so relevant pages never returned count as 0)."""
    relevant = set(relevant)
    if not relevant:
        return None
    hits = 0
    total = 0.0
    for rank, gain in enumerate(_gains(ranking, relevant), 1):
        if gain:
            hits += 1
            total += hits / rank
    return total / len(relevant)


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class ReliabilityBin:
    lower: float
    upper: float
    count: int
    mean_probability: Optional[float]  # None for an empty bin
    observed_frequency: Optional[float]


def _check_pairs(probabilities: Sequence[float], labels: Sequence[int]) -> None:
    if len(probabilities) != len(labels):
        raise ValueError(f"{len(probabilities)} probabilities but {len(labels)} labels")
    for p in probabilities:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"probability {p!r} is outside [0, 1]")


def reliability_bins(probabilities: Sequence[float], labels: Sequence[int], n_bins: int = 10) -> list[ReliabilityBin]:
    """Equal-width bins [0, 0.1), [0.1, 0.2), ..., [0.9, 1.0] (the last one closed)."""
    _check_pairs(probabilities, labels)
    counts = [0] * n_bins
    p_sums = [0.0] * n_bins
    y_sums = [0.0] * n_bins
    for p, y in zip(probabilities, labels):
        b = min(int(p * n_bins), n_bins - 1)
        counts[b] += 1
        p_sums[b] += p
        y_sums[b] += 1.0 if y else 0.0
    return [
        ReliabilityBin(
            lower=b / n_bins,
            upper=(b + 1) / n_bins,
            count=counts[b],
            mean_probability=p_sums[b] / counts[b] if counts[b] else None,
            observed_frequency=y_sums[b] / counts[b] if counts[b] else None,
        )
        for b in range(n_bins)
    ]


def expected_calibration_error(probabilities: Sequence[float], labels: Sequence[int], n_bins: int = 10) -> Optional[float]:
    """Sum over bins of |mean probability - observed frequency|, weighted by the bin's
    share of the pairs; None without pairs."""
    if not probabilities:
        _check_pairs(probabilities, labels)
        return None
    n = len(probabilities)
    return sum(
        b.count / n * abs(b.mean_probability - b.observed_frequency)
        for b in reliability_bins(probabilities, labels, n_bins)
        if b.count
    )


def brier_score(probabilities: Sequence[float], labels: Sequence[int]) -> Optional[float]:
    """Mean squared difference between probability and label; None without pairs."""
    _check_pairs(probabilities, labels)
    if not probabilities:
        return None
    from sklearn.metrics import brier_score_loss

    return float(brier_score_loss([1 if y else 0 for y in labels], list(probabilities), pos_label=1))


def auroc(probabilities: Sequence[float], labels: Sequence[int]) -> Optional[float]:
    """Area under the ROC curve; None when the labels hold only one class (or none)."""
    _check_pairs(probabilities, labels)
    y = [1 if label else 0 for label in labels]
    if len(set(y)) < 2:
        return None
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, list(probabilities)))


# --------------------------------------------------------------------------- aggregation


class Outcome(Protocol):
    """What the aggregate needs from one query run by one configuration."""

    @property
    def relevant(self) -> frozenset[Key]: ...

    @property
    def pool(self) -> Sequence[Key]: ...  # the first-stage candidate pool, best first

    @property
    def ranking(self) -> Sequence[Key]: ...  # what the configuration returned, best first

    @property
    def calibration(self) -> Optional[Sequence[tuple[float, int]]]: ...  # (probability, label), None if no probabilities

    @property
    def fallback(self) -> bool: ...


def mean_of(values: Iterable[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def pool_recall_key(ks: Sequence[int], pool_k: int) -> str:
    """``R@{pool_k}``, or ``pool R@{pool_k}`` when the cut-offs ask for R@{pool_k} of
    the ranking too (a thresholded ranking can hold fewer pages than the pool)."""
    return f"pool R@{pool_k}" if pool_k in ks else f"R@{pool_k}"


def metric_names(ks: Sequence[int], pool_k: int, ndcg_k: int = 10) -> list[str]:
    """The ranking-metric keys of ``aggregate``, in table order."""
    return ([f"P@{k}" for k in ks] + [f"R@{k}" for k in ks]
            + [pool_recall_key(ks, pool_k), "MRR", f"nDCG@{ndcg_k}", "MAP"])


CALIBRATION_METRICS = ("ECE", "Brier", "AUROC")


def aggregate(outcomes: Sequence[Outcome], ks: Sequence[int] = (1, 3), pool_k: int = 20, ndcg_k: int = 10,
              probabilistic: bool = False, n_bins: int = 10) -> dict:
    """Per-query metrics averaged over ``outcomes`` (one configuration).

    ``R@{pool_k}`` is the recall of the first-stage pool: the best recall a reranker
    can reach by reordering it. Recall-type metrics (R@k, R@pool, MRR, nDCG, MAP)
    skip queries without relevant pages; ``queries_without_relevant`` counts them.
    Calibration metrics pool the (probability, label) pairs of every query.
    """
    out: dict = {"queries": len(outcomes),
                 "queries_without_relevant": sum(1 for o in outcomes if not o.relevant)}
    for k in ks:
        out[f"P@{k}"] = mean_of(precision_at_k(o.ranking, o.relevant, k) for o in outcomes)
    for k in ks:
        out[f"R@{k}"] = mean_of(recall_at_k(o.ranking, o.relevant, k) for o in outcomes)
    out[pool_recall_key(ks, pool_k)] = mean_of(recall_at_k(o.pool, o.relevant, pool_k) for o in outcomes)
    out["MRR"] = mean_of(reciprocal_rank(o.ranking, o.relevant) for o in outcomes)
    out[f"nDCG@{ndcg_k}"] = mean_of(ndcg_at_k(o.ranking, o.relevant, ndcg_k) for o in outcomes)
    out["MAP"] = mean_of(average_precision(o.ranking, o.relevant) for o in outcomes)
    out["pages_per_query"] = mean_of(len(o.ranking) for o in outcomes)
    out["queries_without_pages"] = sum(1 for o in outcomes if not o.ranking)
    out["fallbacks"] = sum(1 for o in outcomes if o.fallback)
    probs: list[float] = []
    labels: list[int] = []
    if probabilistic:
        for o in outcomes:
            for p, y in o.calibration or ():
                probs.append(p)
                labels.append(y)
    out["scored_pages"] = len(probs) if probabilistic else None
    out["ECE"] = expected_calibration_error(probs, labels, n_bins) if probabilistic else None
    out["Brier"] = brier_score(probs, labels) if probabilistic else None
    out["AUROC"] = auroc(probs, labels) if probabilistic else None
    return out
