"""Train the feature-based relevance model (``reranker/relevance_model.py``) from
training records (`evidentia dataset`): the CPU default of the classifier reranker.

1. the pages of the records give the domain term statistics (document
   frequencies, stored with the model);
2. every record gets its pool-independent features (``reranker/features.py``),
   computed with the untrained all-MiniLM-L6-v2 bi-encoder;
   the pages judged for each question are remembered with the model
   (``reranker/question_memory.py``); a record's memory features come from the
   memory of the other documents' folds, and four in five (question, document)
   pairs are trained as if the question were new (``MEMORY_DROPOUT``);
3. a logistic regression is fitted on all records (soft labels where a record
   has one) but the foreign ones (pages of a document that cannot hold the query's
   evidence, training/dataset.py), which step 4's calibration alone learns from;
   every record with an answer is also trained without it (question-only queries),
   so the model is calibrated for both;
4. out-of-fold logits (folds by document: a page is scored by a model that never
   saw its document) refit the logit together with features constant over a
   document (``CALIBRATION_FEATURES``: a filing's pages and a report's on one
   scale, the order within a document unchanged); calibrated the same way without
   their own fold, they give the model's calibration and AUROC on unseen
   documents, and the default threshold: the highest t keeping >= 90 % of the
   unthresholded R@3 of each query's pages, in 80 % of resamples of the queries,
   while returning at most half of them, each query's R@3 averaged over
   ``THRESHOLD_DRAWS`` draws of the folds; or, where the recipe gives one, a t
   chosen on labelled validation pools (``TrainingRecipe.threshold``).

Seconds of CPU apart from the bi-encoder (pages are embedded once, then cached).
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from evidentia.reranker.classifier_model import ModelMetadata
from evidentia.reranker.features import FEATURE_NAMES, FeatureExtractor, TermStatistics, question_name
from evidentia.reranker.question_memory import MEMORY_FEATURE_NAMES, QuestionMemory
from evidentia.reranker.relevance_model import (KIND, FeatureModelError, calibrate_documents, calibrated_out_of_fold,
                                                choose_threshold, fit, fold_models, fold_of_groups)
from evidentia.training.dataset import FOREIGN_SOURCE, TrainingRecord, stable_share, training_target
from evidentia.training.query_adapter import fit_query_adapter
from evidentia.training.train import replace_directory

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"
# The inverse L2 strength of the logistic regression, chosen by 5-fold cross-validation
# by document on the training split of both domains (0.1 ranked the hybrid pools
# better than 1.0 in both; docs/BENCHMARKS.md section 8b).
DEFAULT_REGULARISATION = 0.1
MEMORY_FOLDS = 5  # folds by document for the records' own memory features
# Draws of the out-of-fold folds the default threshold is chosen on (each query's R@3
# averaged over them): on one draw t moved from 0.08 to 0.145 with the draw for the same
# model, on ten it stayed within 0.105-0.12 (docs/BENCHMARKS.md, section 8n).
THRESHOLD_DRAWS = 10
# Share of (question, document) pairs trained as if the question were new (memory
# features 0, 0, 0). Without it every new question in training was a filing's, so a new
# question in a sustainability report got a filing's probabilities: cross-validated
# on the training reports with the memory off, ECE 0.176 on their passages, 0.033 with
# it (docs/BENCHMARKS.md, section 8e). 0.8 rather than 0.5: the weights of what a page
# says (cosines, BM25s, ranks in its document) are then learnt mostly on questions the
# model has not met, as most of a new customer's are; in three fold draws of the
# training split never behind 0.5 on P@1 or P@3 in either domain, ahead on
# financebench P@1 in two; over every labelled query the two are level (section 8m).
MEMORY_DROPOUT = 0.8


def embedding_windows() -> dict:
    """The windows the index embeds pages with by default (EVIDENTIA_DENSE_*): the
    model is trained on them, and the classifier embeds pages without stored
    vectors the same way."""
    from evidentia.config import Settings

    defaults = Settings()
    return {"max_tokens": defaults.dense_max_tokens, "window_overlap": defaults.dense_window_overlap,
            "max_windows": defaults.dense_max_windows}


def record_features(records: Sequence[TrainingRecord], extractor: FeatureExtractor,
                    progress: Callable[[int], None] | None = None, vector_source=None,
                    document_source=None, documents: dict | None = None) -> np.ndarray:
    """Features of every record, the records of one query computed together.
    ``documents``: filled with the features of every page of each record's document
    for its query, keyed by (question, answer, doc_id) (see ``record_best_logits``)."""
    by_query: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        by_query[(r.question, r.answer)].append(i)
    out = np.zeros((len(records), len(FEATURE_NAMES)))
    for (question, answer), idx in by_query.items():
        pages = [(records[i].doc_id or None, records[i].page, records[i].page_text) for i in idx]
        pool = extractor.pool_features(question, answer, pages, vector_source=vector_source,
                                       document_source=document_source)
        out[idx] = pool.rows
        if documents is not None:
            documents.update({(question, answer, doc_id): rows for doc_id, rows in pool.documents.items()})
        if progress is not None:
            progress(len(idx))
    return out


def record_best_logits(records: Sequence[TrainingRecord], own_logits: np.ndarray, documents: dict,
                       score: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
    """The best logit among the pages of each record's document for its query (its
    own when its document is unknown); ``score(i, rows)``: the logits that record i's
    model gives its document's pages."""
    out = np.asarray(own_logits, dtype=np.float64).copy()
    best: dict[tuple, float] = {}
    for i, r in enumerate(records):
        key = (r.question, r.answer, r.doc_id)
        if key in documents:
            if key not in best:
                best[key] = float(score(i, documents[key]).max())
            out[i] = max(out[i], best[key])
    return out


def _out_of_fold_logits(records: Sequence[TrainingRecord], x: np.ndarray, labels: Sequence[float],
                        groups: Sequence[str], pages_of_documents: dict, regularisation: float,
                        seed: int, fit_weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each record's logit from the fold model fitted without its document (folds drawn
    with ``seed``), and the best such logit among its document's pages."""
    fold, fold_fits = fold_models(x, labels, groups, weights=fit_weights, regularisation=regularisation, seed=seed)
    logits = np.zeros(len(x))
    for k, fold_fit in enumerate(fold_fits):
        logits[fold == k] = fold_fit.logits(x[fold == k])
    # each page's document's best page, scored by the same out-of-fold model
    best = record_best_logits(records, logits, pages_of_documents, lambda i, rows: fold_fits[fold[i]].logits(rows))
    return logits, best


def query_adapter_pools(records: Sequence[TrainingRecord], extractor: FeatureExtractor, vector_source=None):
    """The judged pools the query adapter learns from, one per (question, answer,
    document) of the records in their own documents, with the document:
    ((query vector, each page's window vectors, each page's label), doc_id)."""
    by_pool: dict[tuple[str, str, str], list[TrainingRecord]] = defaultdict(list)
    for r in records:
        if r.source != FOREIGN_SOURCE and r.question.strip():
            by_pool[(r.question, r.answer, r.doc_id or "")].append(r)
    out = []
    for (question, answer, doc_id), rows in by_pool.items():
        query_vec = extractor.query_vector(question, answer)
        windows = [extractor.page_windows(r.doc_id or None, r.page, r.page_text, vector_source) for r in rows]
        labels = [training_target(r) for r in rows]
        out.append(((query_vec, windows, labels), doc_id))
    return out


def document_families(records: Sequence[TrainingRecord], linked_prefixes: Sequence[str] = (),
                      unlinked: frozenset[str] = frozenset()) -> list[str]:
    """Each record's document family: documents that share an answered query (the same
    question and answer judged in both) are one, so that folds keep them together; so are
    the documents whose id starts with one of ``linked_prefixes`` (one company's reports:
    their memory must come from other companies' labels, as a new supplier's does)."""
    parent: dict[str, str] = {}

    def find(doc: str) -> str:
        while parent.setdefault(doc, doc) != doc:
            parent[doc] = parent[parent[doc]]
            doc = parent[doc]
        return doc

    first_document: dict[tuple[str, str], str] = {}
    first_linked: dict[str, str] = {}
    for r in records:
        doc = r.doc_id or ""
        find(doc)
        for prefix in () if doc in unlinked else linked_prefixes:  # unlinked: documents no prefix names
            if doc.startswith(prefix):
                a, b = find(doc), find(first_linked.setdefault(prefix, doc))
                if a != b:
                    parent[max(a, b)] = min(a, b)
        if r.source == FOREIGN_SOURCE or not r.answer.strip():
            continue  # another document's pages for the query; an unanswered question links every report
        other = first_document.setdefault((r.question, r.answer), doc)
        a, b = find(doc), find(other)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return [find(r.doc_id or "") for r in records]


def memory_entries(records: Sequence[TrainingRecord], extractor: FeatureExtractor, vector_source=None):
    """One memory entry per judged (question, page), with the page's document:
    ((question vector, window vectors, relevant, question), doc_id)."""
    question_vectors: dict[str, np.ndarray] = {}
    seen = set()
    out = []
    for r in records:
        key = (r.question, r.doc_id, r.page, r.page_text)
        if key in seen or not r.question.strip():
            continue
        seen.add(key)
        if r.question not in question_vectors:
            question_vectors[r.question] = extractor.question_vector(r.question)
        relevant = training_target(r) >= 0.5
        windows = extractor.page_windows(r.doc_id or None, r.page, r.page_text, vector_source)
        out.append(((question_vectors[r.question], windows, relevant, r.question), r.doc_id or ""))
    return out


@dataclass(frozen=True)
class TrainingRecipe:
    """How a features model was trained (`evidentia train`'s --threshold-skip-docs,
    --memory-family-docs, --memory-exclude-docs, --calibration-only-docs document
    prefixes, and --threshold).
    It is part of the model: saved with it, and reused by `evidentia retrain`, so that
    the next model reads the same base records the same way (without the shipped
    model's CR_, its threshold would be chosen on generated pools where every page is
    on-topic). ``threshold``: the default t, chosen on labelled validation pools of
    every kind of document (bench/threshold_validation.py) instead of by the
    out-of-fold rule, which only sees the training filings' pools and left a report's
    pool two-thirds returned (docs/BENCHMARKS.md 8ac). The probability is calibrated,
    so the same t means the same for the next model; the rule still runs and is
    recorded beside it."""

    threshold_skip_docs: tuple[str, ...] = ()
    memory_family_docs: tuple[str, ...] = ()
    memory_exclude_docs: tuple[str, ...] = ()
    calibration_only_docs: tuple[str, ...] = ()
    threshold: float | None = None

    def to_dict(self) -> dict:
        return {k: (v if k == "threshold" else list(v)) for k, v in asdict(self).items()
                if k != "threshold" or v is not None}

    @classmethod
    def of_model(cls, extra: dict) -> "TrainingRecipe":
        """The recipe saved in a model's metadata (``extra``); none for a model without one."""
        saved = extra.get("recipe") or {}
        prefixes = {f.name: tuple(str(p) for p in saved.get(f.name, ())) for f in fields(cls) if f.name != "threshold"}
        threshold = saved.get("threshold")
        return cls(**prefixes, threshold=None if threshold is None else float(threshold))


def _warn_unindexed(records: Sequence[TrainingRecord], pages_of_documents: dict, which: str,
                    log: Callable[[str], None]) -> set[str]:
    """Logs how many of the records' documents the index does not hold (their pages were
    read alone: no document features); returns the ids of those it holds."""
    documents = {r.doc_id for r in records if r.doc_id and r.page}
    indexed = documents & {doc_id for _q, _a, doc_id in pages_of_documents}
    if documents - indexed:
        log(f"warning: {len(documents - indexed)} of the {which} {len(documents)} documents are not in the index: "
            f"their pages stand alone. Index them first (`evidentia index`, with the EVIDENTIA_DATA_DIR the "
            f"records were made with; records exported by the API name their tenant's documents: give its "
            f"--tenant) so the model learns from the documents it will read")
    return indexed


def _has_prefix(doc_id: str | None, prefixes: tuple[str, ...]) -> bool:
    return bool(prefixes) and (doc_id or "").startswith(prefixes)


def train_features(records: Sequence[TrainingRecord], out_dir: Path, base_model: str = DEFAULT_EMBEDDER,
                   data_sha256: str = "", regularisation: float = DEFAULT_REGULARISATION, seed: int = 0,
                   log: Callable[[str], None] = print, embedder=None,
                   answerless_copies: bool = True, backend=None,
                   recipe: TrainingRecipe = TrainingRecipe(),
                   threshold_group: Callable[[str], str] | None = None,
                   own_docs: frozenset[str] = frozenset()) -> ModelMetadata:
    """``backend``: an index holding the records' pages (doc_id, page): their window
    vectors are read from it instead of computed (same numbers, much faster), and
    the document features of a record are computed over all pages of its document
    (without it, each page stands alone as a one-page document). ``recipe``: which
    documents' pools do not choose t (threshold_skip_docs), which share a memory fold
    (memory_family_docs), and which are kept out of the question memory (memory_exclude_docs)
    both ways: their labels are not remembered, and their records are fitted as a new
    question's (one company's reports, whose pages teach what a page says but whose
    questions are no other supplier's). ``threshold_group``: a query's group for the
    threshold rule, from its document id (`evidentia retrain`: the base data and the
    analysts' verdicts), so that t keeps the evidence of each (choose_threshold).
    ``own_docs``: documents the recipe's prefixes never name (`evidentia retrain`: the
    analysts' documents; the prefixes name the base data's, and a supplier's report
    whose id happens to start with ``BHP_`` is not the benchmark's)."""
    from evidentia.retriever.dense import PageEmbedder

    if not records:
        raise FeatureModelError("no training records")
    t0 = time.perf_counter()
    given = len(records)
    if answerless_copies:
        # analysts sometimes ask without an answer: each record also trains without it
        records = list(records) + [replace(r, answer="") for r in records if r.answer.strip()]
    # A question that names its company ("Boeing's revenue") gives away a foreign
    # document (reranker/features.py, document_coverage), and most of the filings'
    # training questions do; a new supplier's question may not ("... for 3M?"). Each
    # foreign record of a naming question also trains without its name (the question
    # in lower case: no other feature reads the case), so the calibration still learns
    # what the coverage of the other keywords says of such a document. Without these
    # copies the foreign documents of questions naming nothing kept pages at the
    # threshold in 50 % of held-out pools instead of 40 % (docs/BENCHMARKS.md, section 8t).
    records = list(records) + [replace(r, question=r.question.lower()) for r in records
                               if r.source == FOREIGN_SOURCE and question_name(r.question) is not None]
    # Records of --calibration-only-docs documents (labelled pools of a kind of document the
    # page model must not learn from, e.g. one company's real reports) enter the document
    # calibration alone: scored by the fitted model, as a new supplier's pages are, they
    # set how probable such a document's pages are without moving any page's place in
    # its document, the memory, the term statistics, the adapter or the folds.
    def named(doc_id: str | None, prefixes: tuple[str, ...]) -> bool:
        return doc_id not in own_docs and _has_prefix(doc_id, prefixes)

    calibration_only = [r for r in records if named(r.doc_id, recipe.calibration_only_docs)]
    records = [r for r in records if not named(r.doc_id, recipe.calibration_only_docs)]
    if not records:
        raise FeatureModelError("no training records outside --calibration-only-docs")
    texts = {r.page_text for r in records}
    stats = TermStatistics.from_texts(sorted(texts))
    embedder = embedder or PageEmbedder(base_model, **embedding_windows())
    extractor = FeatureExtractor(embedder, stats)
    # said, or the records counted here ("records" in the metrics) read as twice those given
    copies = (f": {given} given, {len(records) - given} copies (asked without the answer, or without the "
              "company's name)")
    log(f"features of {len(records)} records{copies if len(records) > given else ''} ({len(texts)} distinct pages)...")
    vectors = documents = None
    if backend is not None:
        from evidentia.reranker.features import stored_document_source, stored_vector_source

        vectors = stored_vector_source(backend, embedder.name, embedder.window_settings)
        documents = stored_document_source(backend)  # the document features: every page of a record's document
    groups = [r.doc_id or "" for r in records]
    # the memory holds the pages judged for a question in its own documents
    def unremembered(doc_id: str | None) -> bool:
        return named(doc_id, recipe.memory_exclude_docs)

    entries = memory_entries([r for r in records if r.source != FOREIGN_SOURCE and not unremembered(r.doc_id)],
                             extractor, vectors)
    x = np.zeros((len(records), len(FEATURE_NAMES)))
    pages_of_documents: dict[tuple[str, str, str], np.ndarray] = {}
    folds = fold_of_groups(document_families(records, recipe.memory_family_docs, own_docs), MEMORY_FOLDS, seed)
    # without folds the records' features are computed with no adapter, and the model keeps none
    adapter_pools = []
    if len(set(groups)) >= 2:
        adapter_pools = query_adapter_pools(records, extractor, vectors)
        # A record's memory and adapter features come from a memory and an adapter
        # without its own document (the other folds'), as a new supplier's page meets
        # the questions the model remembers: otherwise the fit would trust a page's
        # memory of itself. Documents that share a query go to one fold (the same
        # report in two layouts would otherwise remember itself).
        for k in sorted(set(folds.tolist())):
            rows = np.flatnonzero(folds == k)
            own = {groups[i] for i in rows}
            extractor.memory = QuestionMemory.build([e for e, g in entries if g not in own])
            extractor.adapter = fit_query_adapter([pool for pool, doc in adapter_pools if doc not in own])
            log(f"memory and query adapter of fold {k + 1}/{len(set(folds.tolist()))} fitted")
            x[rows] = record_features([records[i] for i in rows], extractor, vector_source=vectors,
                                      document_source=documents, documents=pages_of_documents)
    else:
        x[:] = record_features(records, extractor, vector_source=vectors, document_source=documents,
                               documents=pages_of_documents)
    # a new question in any domain, not only in the filings' (whose questions rarely repeat)
    # (and, as for a new question at search time, no query adapter: its columns are the plain cosine's)
    dropped = _memory_dropped(records, MEMORY_DROPOUT, seed) | np.asarray([unremembered(r.doc_id) for r in records],
                                                                            dtype=bool)
    x[np.ix_(dropped, _MEMORY_COLUMNS)] = 0.0
    x[np.ix_(dropped, _ADAPTED_COLUMNS)] = x[np.ix_(dropped, _PLAIN_COLUMNS)]
    for (question, _answer, doc_id), rows in pages_of_documents.items():
        if _drops_memory(question, doc_id, MEMORY_DROPOUT, seed) or unremembered(doc_id):  # pages go with records
            rows[:, _MEMORY_COLUMNS] = 0.0
            rows[:, _ADAPTED_COLUMNS] = rows[:, _PLAIN_COLUMNS]
    memory = QuestionMemory.build([e for e, _g in entries])
    adapter = fit_query_adapter([pool for pool, _doc in adapter_pools], log=log)
    labels = [training_target(r) for r in records]
    hard = np.asarray([r.relevance for r in records])
    # Foreign documents' pages (training/dataset.py) are left out of the page model's fit
    # and enter the document calibration only, where the document's coverage of the query
    # (doc_cov_query) tells their documents apart: in the fit, they taught the page
    # weights that ranking first in a document counts for less, and the filings'
    # evidence fell below the threshold (docs/BENCHMARKS.md, section 8p).
    foreign = np.asarray([r.source == FOREIGN_SOURCE for r in records], dtype=bool)
    # and each record counts as much as its weight says (a large source weighed down)
    fit_weights = (~foreign) * np.asarray([1.0 if r.weight is None else r.weight for r in records])
    model = fit(x, labels, fit_weights, regularisation=regularisation)
    # without its documents the model learns how a page stands in its document from fewer
    # documents than it will read at query time (none at all without an index: no document gap)
    indexed = _warn_unindexed(records, pages_of_documents, "records'", log)
    metrics: dict = {"records": len(records), "positives": int(hard.sum()), "documents": len(set(groups)),
                     "documents_indexed": len(indexed),
                     "memory": {"questions": memory.size, "window_vectors": len(memory.vectors),
                                "similarity": memory.similarity},
                     "feature_seconds": round(time.perf_counter() - t0, 1)}
    if len(set(groups)) >= 2:
        oof_logits, oof_best = _out_of_fold_logits(records, x, labels, groups, pages_of_documents, regularisation,
                                                   seed, fit_weights)
        # a filing's pages and a report's on one scale (CALIBRATION_FEATURES), and the
        # gap to the document's best page, judged out of fold twice over: logits of
        # models without the page's document, a calibration fitted without it
        fit_logits, fit_x, fit_labels, fit_best = oof_logits, x, list(labels), oof_best
        if calibration_only:
            extractor.memory, extractor.adapter = memory, adapter  # as at query time
            pages_only: dict = {}
            x_only = record_features(calibration_only, extractor, vector_source=vectors, document_source=documents,
                                     documents=pages_only)
            logits_only = model.logits(x_only)
            best_only = record_best_logits(calibration_only, logits_only, pages_only, lambda _i, rows: model.logits(rows))
            # else the calibration learns a kind of document from pages read alone (no
            # document gap, the page's own length for the document's)
            _warn_unindexed(calibration_only, pages_only, "--calibration-only-docs records'", log)
            fit_logits, fit_x = np.concatenate([oof_logits, logits_only]), np.vstack([x, x_only])
            fit_labels += [training_target(r) for r in calibration_only]
            fit_best = np.concatenate([oof_best, best_only])
            metrics["calibration_only"] = {"records": len(calibration_only),
                                           "positives": int(sum(r.relevance for r in calibration_only))}
        model = calibrate_documents(model, fit_logits, fit_x, fit_labels, fit_best)
        oof = calibrated_out_of_fold(oof_logits, x, labels, groups, seed=seed, best_logits=oof_best)
        metrics["out_of_fold"] = _oof_metrics(oof, hard)
        pools: dict[tuple[str, str], list[int]] = defaultdict(list)
        answered = any(r.answer.strip() for r in records)
        skipped = recipe.threshold_skip_docs
        for i, r in enumerate(records):
            if named(r.doc_id, skipped):
                continue  # pools unlike a first stage's (e.g. ClimRetrieve: every page on-topic)
            if r.source == FOREIGN_SOURCE:
                continue  # another document's pages: not in the pool of the query's own documents
            if r.answer.strip() or not answered:  # the threshold is chosen on answered queries, the usual case
                pools[(r.question, r.answer)].append(i)
        # the same pools scored under other draws of the folds: which documents a page's
        # model was fitted without moves its probability, and t with it (THRESHOLD_DRAWS)
        log(f"choosing the threshold on {THRESHOLD_DRAWS} out-of-fold draws of {len(pools)} queries' pools...")
        draws = [oof]
        for draw_seed in range(seed + 1, seed + THRESHOLD_DRAWS):
            logits_d, best_d = _out_of_fold_logits(records, x, labels, groups, pages_of_documents, regularisation,
                                                   draw_seed, fit_weights)
            draws.append(calibrated_out_of_fold(logits_d, x, labels, groups, seed=draw_seed, best_logits=best_d))
        try:
            scored = [[(d[idx].tolist(), hard[idx].tolist()) for idx in pools.values()] for d in draws]
            pool_groups = ([threshold_group(records[idx[0]].doc_id or "") for idx in pools.values()]
                           if threshold_group else None)
            choice = choose_threshold(scored[0], other_draws=scored[1:], groups=pool_groups)
            model.threshold = choice.threshold
            metrics["threshold"] = {"t": choice.threshold, "recall_kept": choice.recall_kept,
                                    "pool_share": choice.pool_share, "queries": len(pools),
                                    "confidence": choice.confidence, "fold_draws": len(draws),
                                    "chosen_on": "out-of-fold pools" + (
                                        " (documents " + ", ".join(f"{p}*" for p in skipped) + " left out)"
                                        if skipped else "")}
            if pool_groups:
                metrics["threshold"]["groups"] = dict(sorted(Counter(pool_groups).items()))
        except FeatureModelError as exc:
            log(f"no default threshold: {exc}")
    elif calibration_only:
        log("warning: one document outside --calibration-only-docs: no calibration, its records unused")
    if recipe.threshold is not None:
        rule = metrics.pop("threshold", None)
        model.threshold = recipe.threshold
        metrics["threshold"] = {"t": recipe.threshold, "chosen_on": "validation pools of every kind of "
                                "document (the recipe's threshold; bench/threshold_validation.py)",
                                "out_of_fold_rule": rule}
        log(f"default threshold {recipe.threshold:g} from the recipe (the out-of-fold rule's: "
            f"{rule['t'] if rule else 'none'})")
    metadata = ModelMetadata(
        base_model=base_model,
        metrics=metrics,
        extra={"kind": KIND, "feature_model": model.to_dict(), "embedding": embedding_windows(),
               # how the records were read: `evidentia retrain` trains the next model the same way
               "recipe": recipe.to_dict(),
               "data_sha256": data_sha256, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "train_records": len(records), "term_statistics": stats.to_dict()},
    )
    def write(directory: Path) -> None:
        memory.save(directory)
        if adapter is not None:
            adapter.save(directory)
        metadata.write(directory)

    # a whole new directory: written file by file into --out, a model without a query
    # adapter kept the previous model's, which the reranker then loaded with it
    replace_directory(Path(out_dir), write)
    log(f"trained in {time.perf_counter() - t0:.1f} s: " + json.dumps(metrics))
    return metadata


_MEMORY_COLUMNS = [FEATURE_NAMES.index(n) for n in MEMORY_FEATURE_NAMES]
# the query adapter's features and the plain ones they equal without it
_ADAPTED_COLUMNS = [FEATURE_NAMES.index(n) for n in ("cos_query_adapted", "doc_rank_cos_adapted")]
_PLAIN_COLUMNS = [FEATURE_NAMES.index(n) for n in ("cos_query", "doc_rank_cos")]


def _memory_dropped(records: Sequence[TrainingRecord], share: float, seed: int) -> np.ndarray:
    """Rows whose (question, document) falls in the ``share`` trained without memory:
    a seeded hash, so the same rows every run, and a question's records with and
    without their answer go together."""
    return np.asarray([_drops_memory(r.question, r.doc_id, share, seed) for r in records], dtype=bool)


def _drops_memory(question: str, doc_id: str | None, share: float, seed: int) -> bool:
    return stable_share(f"{seed}:{question}:{doc_id}") < share


def _oof_metrics(probs: np.ndarray, labels: np.ndarray) -> dict:
    from evidentia.evaluation.metrics import expected_calibration_error

    out = {"ECE": round(expected_calibration_error(probs.tolist(), labels.tolist()), 4)}
    if 0 < labels.sum() < len(labels):
        from sklearn.metrics import roc_auc_score

        out["AUROC"] = round(float(roc_auc_score(labels, probs)), 4)
    return out
