"""The feature-based relevance model: a logistic regression over the
pool-independent features of ``reranker/features.py``, stored as JSON in the
model directory (``evidentia-model.json``, ``"kind": "features"``).

p(relevant | question, answer, page) = sigmoid(z + g · (z - z_best)), with
z = w · standardised(features) + b, z_best the highest z among the pages of the
page's document, g = the document gap weight (>= 0; see DocumentCalibration).
Nothing in it depends on the pool, the first stage or the page's place in it: the
document's best page is the same whatever pool the page comes in.
Fitting, the out-of-fold check and the threshold choice live here too, so
`evidentia train` and `evidentia retrain` fit the model the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from evidentia.reranker.features import (AFTER_FIT_PAGE_FEATURES, CALIBRATION_FEATURES, FEATURE_NAMES, FEATURE_SIGNS,
                                         PoolFeatures)

KIND = "features"


class FeatureModelError(ValueError):
    """Training data the model cannot be fitted on; the message says why."""


@dataclass
class FeatureModel:
    names: tuple[str, ...]
    mean: list[float]
    scale: list[float]
    weights: list[float]
    bias: float
    # chosen on out-of-fold pools of the training split (see choose_threshold)
    threshold: float | None = None
    extra: dict = field(default_factory=dict)
    # g = document_gap[0] + document_gap[1:] . (the page's CALIBRATION_FEATURES), all >= 0:
    # how far a page's probability falls with its logit's distance below its
    # document's best page (DocumentCalibration); () before it existed: g = 0
    document_gap: tuple[float, ...] = ()

    def logits(self, features: np.ndarray, best_logits: np.ndarray | None = None) -> np.ndarray:
        """z of each row; with ``best_logits`` (the highest z among the pages of each
        row's document), z + g * (z - z_best)."""
        x = np.asarray(features, dtype=np.float64)
        z = (x - np.asarray(self.mean)) / np.asarray(self.scale) @ np.asarray(self.weights) + self.bias
        if best_logits is None or not any(self.document_gap):
            return z
        return z + self.gap_weights(x) * (z - np.maximum(np.asarray(best_logits, dtype=np.float64), z))

    def gap_weights(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, dtype=np.float64)
        g = np.full(len(x), self.document_gap[0] if self.document_gap else 0.0)
        for j, c in zip(_CALIBRATION_COLUMNS, self.document_gap[1:]):
            g += c * x[:, j]
        return g

    def probabilities(self, features: np.ndarray, best_logits: np.ndarray | None = None) -> np.ndarray:
        return _expit(self.logits(features, best_logits))

    def best_logits(self, pool: PoolFeatures) -> np.ndarray:
        """The highest z among the pages of each pool row's document (the row's own z
        when it stands alone)."""
        own = self.logits(pool.rows)
        best = {doc: float(self.logits(rows).max()) for doc, rows in pool.documents.items() if len(rows)}
        return np.array([max(z, best.get(doc, z)) if doc is not None else z
                         for z, doc in zip(own.tolist(), pool.document_of)])

    def pool_logits(self, pool: PoolFeatures) -> np.ndarray:
        """The final logit of each pool row, its document's best page read (document gap)."""
        return self.logits(pool.rows, self.best_logits(pool))

    def pool_probabilities(self, pool: PoolFeatures) -> np.ndarray:
        return _expit(self.pool_logits(pool))

    def to_dict(self) -> dict:
        return {"names": list(self.names), "mean": self.mean, "scale": self.scale, "weights": self.weights,
                "bias": self.bias, "threshold": self.threshold, "document_gap": list(self.document_gap),
                **self.extra}

    @classmethod
    def from_dict(cls, data: dict) -> "FeatureModel":
        names = tuple(data["names"])
        gap = tuple(float(v) for v in data.get("document_gap") or ())
        had = [n for n in CALIBRATION_FEATURES if n in names]
        if gap and len(had) < len(CALIBRATION_FEATURES) and len(gap) == 1 + len(had):
            # a model from before a document calibration feature: its gap never read it
            by_feature = dict(zip(had, gap[1:]))
            gap = (gap[0], *(by_feature.get(n, 0.0) for n in CALIBRATION_FEATURES))
        if any(len(data[k]) != len(names) for k in ("mean", "scale", "weights")):
            raise FeatureModelError(f"the model file is damaged: {len(names)} feature names but "
                                    f"{len(data['weights'])} weights; retrain it with `evidentia train --kind features`")
        if names != FEATURE_NAMES and len(set(names)) == len(names) and set(names) < set(FEATURE_NAMES):
            # a model from before a feature was added (the document calibration, the
            # statement line items): the same model, weight 0 on what it never had
            column = {name: i for i, name in enumerate(names)}

            def by_name(values: list, absent: float) -> list:
                return [values[column[n]] if n in column else absent for n in FEATURE_NAMES]

            data = {**data, "names": list(FEATURE_NAMES), "mean": by_name(data["mean"], 0.0),
                    "scale": by_name(data["scale"], 1.0), "weights": by_name(data["weights"], 0.0)}
            names = FEATURE_NAMES
        if names != FEATURE_NAMES:
            raise FeatureModelError(f"the model was fitted on features {', '.join(names)}; this version computes "
                                    f"{', '.join(FEATURE_NAMES)}: retrain it with `evidentia train --kind features`")
        if gap and (len(gap) != 1 + len(CALIBRATION_FEATURES) or min(gap) < 0):
            raise FeatureModelError(f"the model file is damaged: document_gap {list(gap)}; retrain it with "
                                    "`evidentia train --kind features`")
        known = {"names", "mean", "scale", "weights", "bias", "threshold", "document_gap"}
        return cls(names, list(data["mean"]), list(data["scale"]), list(data["weights"]), float(data["bias"]),
                   data.get("threshold"), {k: v for k, v in data.items() if k not in known}, gap)


def _targets(labels: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Soft labels as two weighted rows (label 1 with weight p, label 0 with 1 - p):
    the logistic loss of a soft target, which scikit-learn takes as sample weights.
    Returns (row index into the data, label, weight)."""
    p = np.clip(np.asarray(labels, dtype=np.float64), 0.0, 1.0)
    hard = (p == 0.0) | (p == 1.0)
    idx_hard = np.flatnonzero(hard)
    idx_soft = np.flatnonzero(~hard)
    rows = np.concatenate([idx_hard, idx_soft, idx_soft])
    y = np.concatenate([p[idx_hard], np.ones(len(idx_soft)), np.zeros(len(idx_soft))]).astype(int)
    w = np.concatenate([np.ones(len(idx_hard)), p[idx_soft], 1.0 - p[idx_soft]])
    return rows, y, w


def fit(features: np.ndarray, labels: Sequence[float], weights: Sequence[float] | None = None,
        regularisation: float = 1.0) -> FeatureModel:
    """L2-regularised logistic regression on standardised features, the weights of
    FEATURE_SIGNS held to their sign and those of CALIBRATION_FEATURES and
    AFTER_FIT_PAGE_FEATURES at 0 (see calibrate_documents). ``labels``: 0/1 or a probability of relevance;
    ``weights``: per-row weight (default 1)."""
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(FEATURE_NAMES):
        raise FeatureModelError(f"expected {len(FEATURE_NAMES)} features per row, got shape {x.shape}")
    rows, y, w = _targets(labels)
    if weights is not None:
        w = w * np.asarray(weights, dtype=np.float64)[rows]
    if len(set(y.tolist())) < 2:
        raise FeatureModelError("the training data needs relevant and non-relevant pages")
    # rows of weight 0 take no part in the fit, nor in the standardisation
    active = x if weights is None else x[np.asarray(weights, dtype=np.float64) > 0]
    mean = active.mean(axis=0)
    scale = active.std(axis=0)
    scale[scale == 0] = 1.0
    z = (x - mean) / scale
    coef, bias = _sign_constrained_logistic(z[rows], y.astype(np.float64), w, regularisation,
                                            [FEATURE_SIGNS.get(n, 0) for n in FEATURE_NAMES],
                                            fixed=[n in CALIBRATION_FEATURES or n in AFTER_FIT_PAGE_FEATURES
                                                   for n in FEATURE_NAMES])
    return FeatureModel(FEATURE_NAMES, mean.tolist(), scale.tolist(), coef.tolist(), bias)


_CALIBRATION_COLUMNS = [FEATURE_NAMES.index(n) for n in CALIBRATION_FEATURES]
_AFTER_FIT_COLUMNS = [FEATURE_NAMES.index(n) for n in AFTER_FIT_PAGE_FEATURES]


@dataclass(frozen=True)
class DocumentCalibration:
    """logit' = a * logit + shift + doc_coef . c + page_coef . f + (gap_coef[0] + gap_coef[1:] . c) * gap,
    c the page's CALIBRATION_FEATURES, f its AFTER_FIT_PAGE_FEATURES (page_coef <= 0:
    they only lower a page, a cover), gap = logit - the best logit among its
    document's pages (<= 0).

    Why the gap term: a pointwise model gave the pages just below a filing's best
    one p 0.13 where 7 % were relevant. A filing's question has one or two pages of
    evidence: once its best page scores high, the others are less likely to be it. A
    sustainability report's question has many (a quarter of a pool), so the gap
    weighs on a filing (its numeric share, c) more than on a report."""

    a: float
    shift: float
    doc_coef: tuple[float, ...]
    gap_coef: tuple[float, ...] = ()
    page_coef: tuple[float, ...] = ()

    @classmethod
    def fit(cls, logits: np.ndarray, features: np.ndarray, labels: Sequence[float],
            best_logits: np.ndarray | None = None) -> "DocumentCalibration":
        rows, y, w = _targets(labels)
        design = cls._design(logits, features, best_logits)
        n_doc = len(_CALIBRATION_COLUMNS)
        n_page = len(_AFTER_FIT_COLUMNS)
        n_gap = 0 if best_logits is None else 1 + n_doc
        # L2 at scikit-learn's default: nothing against thousands of pages, but a few
        # separable ones (a small retrain) must not stretch the logit without bound.
        # The gap weights >= 0: a page never gains by standing further below its document's best.
        coef, shift = _sign_constrained_logistic(design[rows], y.astype(np.float64), w, 1.0,
                                                 [+1] + [0] * n_doc + [-1] * n_page + [+1] * n_gap)
        if coef[0] <= 0.0:  # the logit carries no signal here: leave it as it is
            return cls(1.0, 0.0, (0.0,) * n_doc, (), (0.0,) * n_page)
        return cls(float(coef[0]), float(shift), tuple(float(c) for c in coef[1:1 + n_doc]),
                   tuple(float(c) for c in coef[1 + n_doc + n_page:]),
                   tuple(float(c) for c in coef[1 + n_doc:1 + n_doc + n_page]))

    @staticmethod
    def _design(logits: np.ndarray, features: np.ndarray, best_logits: np.ndarray | None) -> np.ndarray:
        z = np.asarray(logits, dtype=np.float64)
        x = np.asarray(features, dtype=np.float64)
        c = x[:, _CALIBRATION_COLUMNS]
        columns = [z[:, None], c, x[:, _AFTER_FIT_COLUMNS]]
        if best_logits is not None:
            gap = (z - np.maximum(np.asarray(best_logits, dtype=np.float64), z))[:, None]
            columns += [gap, gap * c]
        return np.hstack(columns)

    def logits(self, logits: np.ndarray, features: np.ndarray, best_logits: np.ndarray | None = None) -> np.ndarray:
        design = self._design(logits, features, best_logits if self.gap_coef else None)
        page_coef = self.page_coef or (0.0,) * len(_AFTER_FIT_COLUMNS)
        return design @ np.asarray((self.a, *self.doc_coef, *page_coef, *self.gap_coef)) + self.shift

    def applied_to(self, model: FeatureModel) -> FeatureModel:
        """The same model with the calibration folded into its weights and document gap
        (`evidentia calibrate` rescales it as before). The document features are
        constant over a document, so the gap of the folded logit is a times the gap of
        the old one, except where an after-fit page feature lowered the document's best
        page (a cover first): its other pages then stand nearer the new best."""
        weights = [self.a * v for v in model.weights]
        bias = self.a * model.bias + self.shift
        for j, c in zip(_CALIBRATION_COLUMNS + _AFTER_FIT_COLUMNS, self.doc_coef + self.page_coef):
            weights[j] = c * model.scale[j]
            bias += c * model.mean[j]
        gap = tuple(c / self.a for c in self.gap_coef)
        return FeatureModel(model.names, model.mean, model.scale, weights, bias, model.threshold, dict(model.extra),
                            gap)


def calibrate_documents(model: FeatureModel, logits: np.ndarray, features: np.ndarray,
                        labels: Sequence[float], best_logits: np.ndarray | None = None) -> FeatureModel:
    """The model with its logit refitted on out-of-fold ``logits`` (each page scored
    by a model that never saw its document) together with CALIBRATION_FEATURES,
    a > 0, and, given ``best_logits`` (the best out-of-fold logit among each page's
    document's pages), the document gap. The document features and the best logit
    are constant over a document, so the order of its pages stays, but for the pages
    AFTER_FIT_PAGE_FEATURES lower (a cover); what moves is how probable a document's
    pages are (a filing's against a report's) and how far those below its best page
    fall."""
    return DocumentCalibration.fit(logits, features, labels, best_logits).applied_to(model)


def calibrated_out_of_fold(logits: np.ndarray, features: np.ndarray, labels: Sequence[float],
                           groups: Sequence[str], folds: int = 5, seed: int = 0,
                           best_logits: np.ndarray | None = None) -> np.ndarray:
    """Probabilities of the out-of-fold ``logits`` after a document calibration
    fitted on the other folds' pages: the calibration is judged on documents it
    was not fitted on either."""
    labels = np.asarray(labels, dtype=np.float64)
    fold = fold_of_groups(groups, folds, seed)
    out = np.zeros(len(logits))
    for k in sorted(set(fold.tolist())):
        test = fold == k
        best_train = None if best_logits is None else best_logits[~test]
        calibration = DocumentCalibration.fit(logits[~test], features[~test], labels[~test], best_train)
        z = calibration.logits(logits[test], features[test], None if best_logits is None else best_logits[test])
        out[test] = _expit(z)
    return out


def _sign_constrained_logistic(z: np.ndarray, y: np.ndarray, w: np.ndarray, c: float,
                               signs: Sequence[int], fixed: Sequence[bool] | None = None) -> tuple[np.ndarray, float]:
    """scikit-learn's LogisticRegression objective (C * weighted log-loss + |coef|^2 / 2,
    intercept free), minimised by L-BFGS-B with coef_j >= 0 where signs[j] > 0,
    coef_j <= 0 where signs[j] < 0 and coef_j = 0 where fixed[j] (scikit-learn takes
    no bounds)."""
    from scipy.optimize import minimize

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        coef, bias = theta[:-1], theta[-1]
        margin = z @ coef + bias
        loss = np.sum(w * (np.logaddexp(0.0, margin) - y * margin))
        residual = w * (_expit(margin) - y)
        grad = np.concatenate([c * (z.T @ residual) + coef, [c * residual.sum()]])
        return c * loss + 0.5 * coef @ coef, grad

    fixed = fixed or [False] * len(signs)
    bounds = [(0.0, 0.0) if f else (0.0, None) if s > 0 else (None, 0.0) if s < 0 else (None, None)
              for s, f in zip(signs, fixed)] + [(None, None)]
    result = minimize(objective, np.zeros(z.shape[1] + 1), jac=True, method="L-BFGS-B", bounds=bounds,
                      options={"maxiter": 5000, "gtol": 1e-8})
    return result.x[:-1], float(result.x[-1])


def fold_of_groups(groups: Sequence[str], folds: int = 5, seed: int = 0) -> np.ndarray:
    """The fold (0 .. folds-1) of each row, whole groups (documents) to a fold."""
    import random

    uniq = sorted(set(groups))
    random.Random(seed).shuffle(uniq)
    fold_of = {g: i % folds for i, g in enumerate(uniq)}
    return np.asarray([fold_of[g] for g in groups], dtype=int)


def out_of_fold(features: np.ndarray, labels: Sequence[float], groups: Sequence[str], weights=None,
                folds: int = 5, regularisation: float = 1.0, seed: int = 0, logits: bool = False) -> np.ndarray:
    """Each row's probability (or logit) from a model fitted without its group
    (document): held-out predictions on the training split, for the threshold and
    the calibration check without touching the test split."""
    x = np.asarray(features, dtype=np.float64)
    fold, models = fold_models(x, labels, groups, weights, folds, regularisation, seed)
    out = np.zeros(len(x))
    for k, model in enumerate(models):
        test = fold == k
        out[test] = model.logits(x[test]) if logits else model.probabilities(x[test])
    return out


def fold_models(features: np.ndarray, labels: Sequence[float], groups: Sequence[str], weights=None,
                folds: int = 5, regularisation: float = 1.0, seed: int = 0) -> tuple[np.ndarray, list[FeatureModel]]:
    """The fold of each row (by group) and, for each fold k, the model fitted without it."""
    x = np.asarray(features, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    fold = fold_of_groups(groups, folds, seed)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    models = []
    for k in range(min(folds, len(set(groups)))):
        train = fold != k
        models.append(fit(x[train], labels[train], None if w is None else w[train], regularisation))
    return fold, models


@dataclass(frozen=True)
class ThresholdChoice:
    threshold: float
    recall_kept: float  # R@3 at t over R@3 unthresholded
    pool_share: float  # pages returned / pages in the pool
    sweep: list[dict]
    confidence: float | None = None  # share of query resamples in which t keeps enough (None: not resampled)


# The share of query resamples in which t must keep min_recall_kept. The highest t
# that does so on the training pools themselves sits at the edge of what those few
# queries allow, and new companies' pools kept less: of the training split's 34
# financebench pools (cross-fitted), t chosen on 20 kept 86 % of the other 14's R@3 on
# average, below 90 % in 56 % of 200 draws; chosen on 0.8 of resamples, 92 %
# (bench/threshold_rule.py, docs/BENCHMARKS.md section 8g).
THRESHOLD_CONFIDENCE = 0.8
_THRESHOLD_RESAMPLES = 1000


# The threshold's goals (issue #13): a t that replaces a fixed top-k keeps at least
# this share of the unthresholded R@3 while returning at most this share of the pool.
MIN_RECALL_KEPT = 0.9
MAX_POOL_SHARE = 0.5


def recall_at_thresholds(pools: Sequence[tuple[Sequence[float], Sequence[int]]], thresholds: Sequence[float],
                         k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """R@k of each query with a relevant page (columns) when pages below each
    threshold (rows) are dropped, and the share of all pool pages each keeps.
    ``pools``: (probabilities, 0/1 labels) per query."""
    recall = np.zeros((len(thresholds), len(pools)))
    kept_pages = np.zeros(len(thresholds))
    has_relevant = np.zeros(len(pools), dtype=bool)
    total = 0
    for q, (probs, labels) in enumerate(pools):
        order = sorted(range(len(probs)), key=lambda i: -probs[i])
        relevant = sum(labels)
        has_relevant[q] = relevant > 0
        total += len(probs)
        for j, t in enumerate(thresholds):
            top = [i for i in order if probs[i] >= t][:k]
            if relevant:
                recall[j, q] = sum(labels[i] for i in top) / relevant
            kept_pages[j] += sum(1 for p in probs if p >= t)
    return recall[:, has_relevant], (kept_pages / total if total else np.zeros(len(thresholds)))


# The thresholds a rule may choose from: 0 to 0.5 in steps of 0.005.
THRESHOLD_GRID = tuple(round(float(x), 3) for x in np.arange(0.0, 0.501, 0.005))


def resamples_keeping(recall: np.ndarray, min_recall_kept: float, resamples: int, seed: int) -> np.ndarray:
    """Per threshold (a row of ``recall``, as ``recall_at_thresholds`` gives it, the
    first row unthresholded): the share of bootstrap resamples of the queries (columns)
    in which it keeps at least ``min_recall_kept`` of the unthresholded R@k (seeded)."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, recall.shape[1], size=(resamples, recall.shape[1]))
    base_sums = recall[0][draws].sum(axis=1)
    return np.array([np.mean(row[draws].sum(axis=1) >= min_recall_kept * base_sums - 1e-12) for row in recall])


def choose_threshold(pools: Sequence[tuple[Sequence[float], Sequence[int]]], min_recall_kept: float = MIN_RECALL_KEPT,
                     max_pool_share: float = MAX_POOL_SHARE, k: int = 3, confidence: float | None = THRESHOLD_CONFIDENCE,
                     seed: int = 0, other_draws: Sequence[Sequence[tuple[Sequence[float], Sequence[int]]]] = (),
                     groups: Sequence[str] | None = None) -> ThresholdChoice:
    """The highest t that keeps at least ``min_recall_kept`` of the unthresholded
    R@k while returning at most ``max_pool_share`` of the pool. ``pools``:
    (probabilities, 0/1 labels) per query, every page of the pool. With
    ``confidence``, t must keep that share of R@k in at least that share of
    bootstrap resamples of the queries (seeded: the same t every run), so that it
    keeps the evidence of queries like these, not only of these; None: on the
    pools as given. ``other_draws``: the same queries' pools, in the same order,
    scored otherwise (other out-of-fold draws): each query's R@k and the pool share
    are averaged over all draws before the rule reads them. ``groups``: a label per
    pool (e.g. the base data and the analysts' verdicts); t must then keep
    ``min_recall_kept`` of each group's R@k, so that many queries of one kind cannot
    outvote a few of another, whose evidence t would hide."""
    grid = list(THRESHOLD_GRID)
    recall, share = recall_at_thresholds(pools, grid, k)
    for draw in other_draws:
        if len(draw) != len(pools):
            raise ValueError("every draw must score the same queries")
        more_recall, more_share = recall_at_thresholds(draw, grid, k)
        recall, share = recall + more_recall, share + more_share
    recall, share = recall / (1 + len(other_draws)), share / (1 + len(other_draws))
    if groups is not None and len(groups) != len(pools):
        raise ValueError("one group label per pool")
    with_relevant = [g for g, (_probs, labels) in zip(groups or [""] * len(pools), pools) if sum(labels)]
    base = recall[0].mean() if recall.shape[1] else 0.0
    # per group: R@k kept at each t, and (with confidence) the share of resamples that keep enough
    kept_by_group, resampled_by_group = [], []
    for g, group in enumerate(sorted(set(with_relevant))):
        columns = np.asarray([i for i, label in enumerate(with_relevant) if label == group])
        part = recall[:, columns]
        group_base = part[0].mean()
        kept_by_group.append(part.mean(axis=1) / group_base if group_base else np.zeros(len(grid)))
        if confidence is not None:  # seed + 0: one group draws as before groups existed
            resampled_by_group.append(resamples_keeping(part, min_recall_kept, _THRESHOLD_RESAMPLES, seed + g))
    resampled = np.min(resampled_by_group, axis=0) if resampled_by_group else None
    sweep = []
    best = None
    for j, t in enumerate(grid):
        kept = recall[j].mean() / base if base else 0.0
        row = {"t": t, "R@3": round(float(recall[j].mean()) if recall.shape[1] else 0.0, 4),
               "recall_kept": round(float(kept), 4), "pool_share": round(float(share[j]), 4)}
        if len(kept_by_group) > 1:
            row["recall_kept_worst_group"] = round(float(min(k_g[j] for k_g in kept_by_group)), 4)
        if resampled is not None:
            row["resamples_kept"] = round(float(resampled[j]), 4)
        sweep.append(row)
        sure = bool(kept_by_group) and (all(k_g[j] >= min_recall_kept for k_g in kept_by_group) if resampled is None
                                        else resampled[j] >= confidence)
        if sure and share[j] <= max_pool_share:
            best = (t, kept, share[j])
    if best is None:
        raise FeatureModelError(f"no threshold keeps {min_recall_kept:.0%} of R@{k} while returning at most "
                                f"{max_pool_share:.0%} of the pool")
    return ThresholdChoice(best[0], round(float(best[1]), 4), round(float(best[2]), 4), sweep, confidence)


def _expit(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
