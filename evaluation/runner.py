"""Run evaluation queries through the engine, once per configuration.

Each distinct (first stage, reranker) pair is built once and runs every query
once. A reranker that outputs probabilities is built without a threshold, so it
returns every pool page with its probability; each configuration's threshold is
then applied here, and ``classifier@0.15`` and ``classifier@0.4`` share one
reranking pass. The unfiltered output is kept for the calibration metrics and
the threshold sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from evidentia.config import ConfigError
from evidentia.engine import Engine, RunConfig, SearchResult, parse_config
from evidentia.evaluation import metrics
from evidentia.evaluation.queries import EvalQuery, category_fields, category_of
from evidentia.records import Candidate, RankedPage
from evidentia.text import listed

# Thresholds of the sweep: 0, 0.05, ..., 0.9.
SWEEP_THRESHOLDS = tuple(round(i * 0.05, 2) for i in range(19))
NDCG_K = 10
MAX_LISTED = 10


class UnknownDocumentsError(LookupError):
    """Queries name documents the backend does not hold."""

    def __init__(self, missing: Sequence[str], pdf_dir: Optional[Path] = None):
        self.missing = list(missing)
        self.pdf_dir = pdf_dir
        super().__init__(self.message)

    @property
    def message(self) -> str:
        shown = ", ".join(self.missing[:MAX_LISTED])
        more = len(self.missing) - MAX_LISTED
        if more > 0:
            shown += f" and {more} more"
        n = len(self.missing)
        head = f"{n} document id(s) named in the queries are not indexed: {shown}"
        if self.pdf_dir is not None:
            from evidentia.indexing import missing_pdfs_hint

            return (f"{head}; {self.pdf_dir} has no PDF with those ids (or it failed to index)"
                    + missing_pdfs_hint(self.missing, [self.pdf_dir]))
        return f"{head}; index them with `evidentia index`, or pass --pdf-dir DIR holding their PDFs"

    def __str__(self) -> str:
        return self.message


# --------------------------------------------------------------------------- configurations


def parse_compare(spec: str) -> list[RunConfig]:
    """Comma-separated configuration strings; duplicates (same label) are dropped."""
    configs: dict[str, RunConfig] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        config = parse_config(part)
        configs.setdefault(config.label, config)
    if not configs:
        raise ConfigError("--compare names no configuration (e.g. --compare bm25)")
    return list(configs.values())


# --------------------------------------------------------------------------- documents


def all_doc_ids(queries: Sequence[EvalQuery]) -> list[str]:
    return list(dict.fromkeys(d for q in queries for d in q.doc_ids))


def pages_beyond_documents(queries: Sequence[EvalQuery], engine: Engine) -> Optional[str]:
    """One line on the labelled pages past the end of their document (None when there
    are none): such a page can never be found, so every metric of its query would read
    0 with nothing said. Page 0 is refused when the file is read (queries.py)."""
    counts: dict[str, Optional[int]] = {}
    problems = []
    for q in queries:
        for name, pages in (("relevant", q.relevant), ("partly relevant", q.partly_relevant)):
            for doc_id, page in sorted(pages):
                if doc_id not in counts:
                    info = engine.backend.get_document(doc_id)
                    counts[doc_id] = info.pages if info is not None else None
                if counts[doc_id] is not None and page > counts[doc_id]:
                    problems.append(f"query {q.id}: {name} page {page} of {doc_id}, which has "
                                    f"{counts[doc_id]} page(s)")
    if not problems:
        return None
    shown = listed(problems, 3, "; ")
    return (f"{shown}: pages are 1-based, as a PDF viewer numbers them; correct the page numbers, or the doc_id "
            "if the query names the wrong document")


# --------------------------------------------------------------------------- runs


def apply_threshold(pages: Sequence[RankedPage], threshold: Optional[float], fallback: bool = False) -> list[RankedPage]:
    """Keep pages whose probability is >= ``threshold``, in the reranker's order.
    A fallback result (first-stage order, no probabilities) is kept whole."""
    if threshold is None or fallback:
        return list(pages)
    return [p for p in pages if p.probability is not None and p.probability >= threshold]


@dataclass
class QueryRun:
    """One query through one configuration (implements ``metrics.Outcome``)."""

    query: EvalQuery
    candidates: list[Candidate]  # the first-stage pool, best first
    pages: list[RankedPage]  # the configuration's final ranking, best first
    unfiltered: Optional[list[RankedPage]]  # probability rerankers: every page scored, before the threshold
    fallback_reason: Optional[str] = None

    @property
    def relevant(self) -> frozenset[tuple[str, int]]:
        return self.query.relevant

    @property
    def pool(self) -> list[tuple[str, int]]:
        return [(c.doc_id, c.page) for c in self.candidates]

    @property
    def ranking(self) -> list[tuple[str, int]]:
        return [(p.doc_id, p.page) for p in self.pages]

    @property
    def calibration(self) -> Optional[list[tuple[float, int]]]:
        if self.unfiltered is None:
            return None
        rel = self.query.relevant
        return [(p.probability, int((p.doc_id, p.page) in rel)) for p in self.unfiltered if p.probability is not None]

    @property
    def fallback(self) -> bool:
        return self.fallback_reason is not None


@dataclass
class ConfigRun:
    config: RunConfig
    probabilistic: bool  # the reranker outputs calibrated probabilities
    runs: list[QueryRun]
    # the reranker's model (a classifier's: directory@created+data hash), which the numbers are of
    model_version: Optional[str] = None

    @property
    def label(self) -> str:
        return self.config.label

    @property
    def pass_key(self) -> tuple[str, str]:
        return (self.config.stage, self.config.reranker)


def run_configs(queries: Sequence[EvalQuery], configs: Sequence[RunConfig], engine: Engine,
                pool_size: Optional[int] = None, progress: bool = True) -> list[ConfigRun]:
    """Every query through every configuration; one reranking pass per (stage, reranker)."""
    from evidentia.progress import Progress

    pool_size = pool_size or engine.settings.pool_size
    # Build every reranker (without threshold: every page keeps its probability)
    # and check every threshold before the first (long) pass.
    rerankers = {}
    for config in configs:
        key = (config.stage, config.reranker)
        if key not in rerankers:
            rerankers[key] = engine.rerankers.get(config.reranker, None)
        if config.threshold is not None and not rerankers[key].outputs_probabilities:
            raise ConfigError(f"{config.label!r}: reranker {config.reranker!r} does not output "
                              "probabilities, so it takes no threshold")
    passes: dict[tuple[str, str], tuple[bool, list[SearchResult]]] = {}
    results: list[ConfigRun] = []
    for config in configs:
        key = (config.stage, config.reranker)
        if key not in passes:
            reranker = rerankers[key]
            run_config = RunConfig(stage=config.stage, reranker=config.reranker, pool_size=pool_size)
            outputs = []
            with Progress(len(queries), run_config.label, "queries", show=progress,
                          every_s=engine.settings.progress_interval_s) as bar:
                for q in queries:
                    outputs.append(engine.search(q.question, q.answer, q.doc_ids, run_config, reranker=reranker))
                    bar.update()
            passes[key] = (reranker.outputs_probabilities, outputs)
        probabilistic, outputs = passes[key]
        runs = []
        for q, out in zip(queries, outputs):
            fallback = out.fallback_reason is not None
            runs.append(QueryRun(
                query=q,
                candidates=list(out.candidates),
                pages=apply_threshold(out.pages, config.threshold, fallback),
                unfiltered=list(out.pages) if probabilistic else None,
                fallback_reason=out.fallback_reason,
            ))
        results.append(ConfigRun(config=config, probabilistic=probabilistic, runs=runs,
                                 model_version=rerankers[key].model_version))
    return results


# --------------------------------------------------------------------------- summaries


def threshold_sweep(config_run: ConfigRun, thresholds: Sequence[float] = SWEEP_THRESHOLDS, k: int = 3) -> list[dict]:
    """P@k, R@k and pages per query for each threshold, from the unfiltered
    probabilities; with the two figures a default t is chosen by (the issue's goals:
    keep >= 90 % of the unthresholded R@k, return <= half of the pool): ``R@k_kept``,
    R@k at t over R@k unthresholded, and ``pool_share``, the pool pages returned."""
    def at(t: float) -> tuple[list, list, list]:
        p, r, n = [], [], []
        for run in config_run.runs:
            ranking = [(x.doc_id, x.page) for x in apply_threshold(run.unfiltered or [], t, run.fallback)]
            p.append(metrics.precision_at_k(ranking, run.relevant, k))
            r.append(metrics.recall_at_k(ranking, run.relevant, k))
            n.append(len(ranking))
        return p, r, n

    pool_pages = sum(len(run.unfiltered or []) for run in config_run.runs)
    unthresholded = metrics.mean_of(at(0.0)[1])
    rows = []
    for t in thresholds:
        p, r, n = at(t)
        recall = metrics.mean_of(r)
        rows.append({"threshold": t, f"P@{k}": metrics.mean_of(p), f"R@{k}": recall,
                     f"R@{k}_kept": (recall / unthresholded if recall is not None and unthresholded else None),
                     "pool_share": sum(n) / pool_pages if pool_pages else None,
                     "pages_per_query": metrics.mean_of(n)})
    return rows


def reliability(config_run: ConfigRun, n_bins: int = 10) -> list[metrics.ReliabilityBin]:
    pairs = [pair for run in config_run.runs for pair in (run.calibration or ())]
    return metrics.reliability_bins([p for p, _ in pairs], [y for _, y in pairs], n_bins)


def summarize(config_runs: Sequence[ConfigRun], queries: Sequence[EvalQuery], ks: Sequence[int],
              pool_size: int) -> dict:
    """Everything `evidentia eval --json` prints: metrics per configuration, per
    category value and configuration, and threshold sweeps of probability rerankers."""
    def agg(runs, probabilistic, ks_=ks):
        return metrics.aggregate(runs, ks=ks_, pool_k=pool_size, ndcg_k=NDCG_K, probabilistic=probabilistic)

    summary: dict = {
        "queries": len(queries),
        "pool_size": pool_size,
        "k": list(ks),
        "configs": {c.label: {"stage": c.config.stage, "reranker": c.config.reranker,
                              "threshold": c.config.threshold, "probabilistic": c.probabilistic,
                              "model_version": c.model_version,
                              **agg(c.runs, c.probabilistic)} for c in config_runs},
        "metrics": metrics.metric_names(ks, pool_size, NDCG_K),
        "categories": {},
        "threshold_sweeps": {},
    }
    for name, values in category_fields(list(queries)).items():
        table: dict = {}
        for value in values:
            table[value] = {}
            for c in config_runs:
                subset = [r for r in c.runs if category_of(r.query, name) == value]
                table[value][c.label] = agg(subset, c.probabilistic)
        summary["categories"][name] = table
    seen: set[tuple[str, str]] = set()
    for c in config_runs:
        if c.probabilistic and c.pass_key not in seen:
            seen.add(c.pass_key)
            # the grid, and every threshold configured for this pass (e.g. the default t)
            configured = {x.config.threshold for x in config_runs
                          if x.pass_key == c.pass_key and x.config.threshold is not None}
            summary["threshold_sweeps"][pass_label(c)] = threshold_sweep(
                c, tuple(sorted(set(SWEEP_THRESHOLDS) | configured)))
    return summary


def pass_label(config_run: ConfigRun) -> str:
    """The label of a reranking pass, without threshold (shared by its configurations)."""
    c = config_run.config
    return RunConfig(stage=c.stage, reranker=c.reranker).label
