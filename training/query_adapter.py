"""Fitting the query adapter (``reranker/query_adapter.py``) on judged pools.

Each pool is one query's judged pages of one document: (query vector, the pages'
window vectors, their labels). A page scores the best cosine of its windows with the
adapted query; the loss is each pool's listwise cross-entropy (softmax over its pages
at temperature ``TEMPERATURE``, the relevant pages the target, weighted by their
labels), averaged over pools, plus ``PENALTY`` times the squared size of ``M``, so
that the adapter stays near the identity where the pools say little. Full-batch
Adam in float64 from ``M = 0``: no random draw, the same matrix every run.

In 5-fold cross-validation by report on the training split (folds of both layouts of a
report together), the adapted cosine alone ranked unseen documents' pages better than
the untrained one: AUROC within the pool 0.762 -> 0.838 (filings), 0.727 -> 0.803
(report passages), 0.661 -> 0.779 (printed reports); the penalty 0.1 against 1.0 and
0.01 was the best on the printed reports and within 0.01 elsewhere (docs/BENCHMARKS.md
section 8s).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from evidentia.reranker.query_adapter import QueryAdapter

TEMPERATURE = 0.05
PENALTY = 0.1
STEPS = 150
LEARNING_RATE = 1e-3


def fit_query_adapter(pools: Sequence[tuple[np.ndarray, Sequence[np.ndarray], Sequence[float]]],
                      penalty: float = PENALTY, steps: int = STEPS, learning_rate: float = LEARNING_RATE,
                      log: Callable[[str], None] | None = None) -> QueryAdapter | None:
    """``pools``: (query vector, each page's window vectors, each page's label in [0, 1]).
    Pools without both a relevant and an irrelevant page teach nothing and are left out;
    None when no pool is left."""
    import torch

    usable = [(q, pages, labels) for q, pages, labels in pools
              if len(pages) >= 2 and max(labels) > 0 and min(labels) < 1
              and all(w is not None and len(w) for w in pages)]
    if not usable:
        return None
    dim = len(usable[0][0])
    queries, windows, window_page, page_pool, targets = [], [], [], [], []
    page = 0
    for p, (q, pages, labels) in enumerate(usable):
        queries.append(np.asarray(q, dtype=np.float64))
        total = float(sum(labels))
        for w, label in zip(pages, labels):
            windows.append(np.asarray(w, dtype=np.float64))
            window_page.extend([page] * len(w))
            page_pool.append(p)
            targets.append(float(label) / total)
            page += 1
    with torch.no_grad():
        q_all = torch.tensor(np.vstack(queries))
        w_all = torch.tensor(np.vstack(windows))
        w_page = torch.tensor(window_page)
        p_pool = torch.tensor(page_pool)
        target = torch.tensor(targets, dtype=torch.float64)
    n_pages, n_pools = page, len(usable)
    matrix = torch.zeros(dim, dim, dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.Adam([matrix], lr=learning_rate)
    for step in range(steps):
        optimiser.zero_grad()
        moved = q_all + q_all @ matrix.T
        moved = moved / moved.norm(dim=1, keepdim=True)
        window_scores = (w_all * moved[p_pool[w_page]]).sum(dim=1) / TEMPERATURE
        page_scores = torch.full((n_pages,), -torch.inf, dtype=torch.float64).scatter_reduce(
            0, w_page, window_scores, reduce="amax")
        pool_max = torch.full((n_pools,), -torch.inf, dtype=torch.float64).scatter_reduce(
            0, p_pool, page_scores, reduce="amax").detach()
        shifted = torch.exp(page_scores - pool_max[p_pool])
        log_norm = torch.log(torch.zeros(n_pools, dtype=torch.float64).index_add(0, p_pool, shifted)) + pool_max
        log_softmax = page_scores - log_norm[p_pool]
        loss = -(target * log_softmax).sum() / n_pools + penalty * (matrix ** 2).sum()
        loss.backward()
        optimiser.step()
        if log and (step + 1) % 50 == 0:
            log(f"query adapter: step {step + 1}/{steps}, loss {float(loss.detach()):.4f}")
    return QueryAdapter(matrix.detach().numpy().astype(np.float32))
