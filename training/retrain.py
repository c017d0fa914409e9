"""Retraining from analyst feedback, gated by an evaluation on held-out documents.

One round:
1. verdicts (exported feedback) are resolved: per (question, answer, document,
   page) the majority verdict wins; a tie goes to the most recent verdict;
2. verdicts are grouped into queries (question + answer) and split by document:
   a document is held out when a seeded hash of its id says so, so the split is
   the same in every round and a held-out document never reaches training, not
   even through the base training data; a query asked of several documents (one
   supplier's reports) is split with them: its verdicts on the held-out ones are
   judged, those on the others trained on;
3. training set = base records (held-out documents removed) + the training
   queries' verdicts + hard negatives from the pools of the first stage the
   reranker sits behind (EVIDENTIA_STAGE) and random other pages of their
   documents (dataset.DEFAULT_DOCUMENT_NEGATIVES) for each of them; duplicates removed;
4. a candidate is trained (a LoRA one has its calibration refitted on the training
   queries' pools: margin and place in the pool) and registered; candidate and
   production model are evaluated on the held-out queries with the evaluation
   metrics (P@3 over the pool, ECE over its labelled pages);
5. the candidate is promoted unless the held-out queries show it worse: P@3 lower
   in at least GATE_DROP_CONFIDENCE of paired resamples of their documents, or ECE worse by
   more than ``ece_margin``, or too few of them have a page judged relevant to show anything
   (EVIDENTIA_RETRAIN_MIN_HELDOUT_QUERIES); otherwise production stays and the reason is given.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from evidentia.evaluation.metrics import expected_calibration_error, precision_at_k, recall_at_k
from evidentia.evaluation.queries import EvalQuery
from evidentia.training.dataset import (TrainingRecord, dedupe, first_stage_pool, records_from_queries, stable_share,
                                        write_records)
from evidentia.reranker.model_registry import ModelEntry, ModelRegistry
from evidentia.tenants import split_internal_id
from evidentia.training.train import TrainingError, TrainParams, train
from evidentia.text import listed

if TYPE_CHECKING:  # pragma: no cover
    from evidentia.engine import Engine
    from evidentia.training.train_features import TrainingRecipe


@dataclass(frozen=True)
class Verdict:
    question: str
    answer: str
    doc_id: str
    page: int
    relevant: bool
    created: str = ""  # ISO time; orders verdicts for the tie rule
    # the page's text when the analyst judged it (the store and its export keep it): a
    # document uploaded again under its id holds another file's page there
    page_text: str | None = None


def resolve_verdicts(verdicts: Iterable[Verdict]) -> dict[tuple[str, str, str, int], bool]:
    """Majority per (question, answer, doc_id, page); a tie goes to the latest verdict."""
    grouped: dict[tuple[str, str, str, int], list[Verdict]] = defaultdict(list)
    for v in verdicts:
        grouped[(v.question, v.answer, v.doc_id, v.page)].append(v)
    resolved = {}
    for key, vs in grouped.items():
        yes = sum(v.relevant for v in vs)
        no = len(vs) - yes
        resolved[key] = yes > no if yes != no else max(vs, key=lambda v: v.created).relevant
    return resolved


def _held_out_share(doc_id: str, seed: int) -> float:
    return stable_share(f"heldout:{seed}:{doc_id}")


def held_out_document(doc_id: str, fraction: float, seed: int = 0) -> bool:
    """Stable per document: the same answer in every round, whatever else changes."""
    return _held_out_share(doc_id, seed) < fraction


def held_out_documents(docs: Iterable[str], fraction: float, seed: int = 0) -> set[str]:
    """The documents whose verdicts the gate reads and training never sees: those the
    hash holds out, or, when it holds out none, the one with the lowest hash. Without
    that, feedback on a few documents was never evaluated: with two, the hash at 0.3
    holds out neither half the time, and production was kept for want of a held-out
    query (docs/BENCHMARKS.md 8ac). A lone document is held out too: trained on, it
    could not be evaluated anyway, and held out it can never be a verdict a model
    trained on and is then judged on. As documents are added, a document that trained
    is never held out later (only a new one, lower, takes the place), unless the
    held-out one is deleted."""
    docs = sorted(set(docs))
    held = {d for d in docs if held_out_document(d, fraction, seed)}
    if not held and docs and fraction > 0:
        held = {min(docs, key=lambda d: _held_out_share(d, seed))}
    return held


def verdict_queries(resolved: dict[tuple[str, str, str, int], bool]) -> list[EvalQuery]:
    """Queries with their documents and the pages judged relevant."""
    by_query: dict[tuple[str, str], dict] = {}
    for (question, answer, doc_id, page), relevant in resolved.items():
        q = by_query.setdefault((question, answer), {"docs": set(), "relevant": set()})
        q["docs"].add(doc_id)
        if relevant:
            q["relevant"].add((doc_id, page))
    out = []
    for i, ((question, answer), q) in enumerate(sorted(by_query.items())):
        qid = hashlib.sha1(f"{question}\n{answer}".encode()).hexdigest()[:12]
        out.append(EvalQuery(id=qid, doc_ids=tuple(sorted(q["docs"])), question=question, answer=answer,
                             relevant=frozenset(q["relevant"])))
    return out


def _query_on(query: EvalQuery, held_docs: set[str], held: bool) -> EvalQuery | None:
    """The part of ``query`` on its held-out documents (``held``) or on the others; None if it has none."""
    docs = tuple(d for d in query.doc_ids if (d in held_docs) == held)
    if not docs:
        return None
    if docs == query.doc_ids:
        return query
    return replace(query, doc_ids=docs, relevant=frozenset(x for x in query.relevant if x[0] in docs),
                   partly_relevant=frozenset(x for x in query.partly_relevant if x[0] in docs))


@dataclass
class SplitData:
    train_records: list[TrainingRecord]
    train_queries: list[EvalQuery]
    held_out_queries: list[EvalQuery]
    held_out_docs: set[str]


def build_training_set(verdicts: Sequence[Verdict], base_records: Sequence[TrainingRecord], engine: "Engine",
                       held_out_fraction: float = 0.3, negatives_per_query: int = 8, seed: int = 0,
                       stage: str = "bm25") -> SplitData:
    resolved = resolve_verdicts(verdicts)
    queries = verdict_queries(resolved)
    # Only documents with verdicts are split: the gate reads held-out verdicts alone, so
    # a base document without any (the shipped model's filings and reports) holding
    # out would only take its records from the candidate (a third of them, by hash)
    docs = {d for q in queries for d in q.doc_ids}
    held_docs = held_out_documents(docs, held_out_fraction, seed)
    # No page of a held-out document may train, nor a base record of it. A query asked of
    # several documents is split with them: held out whole, one supplier's two reports
    # asked the same questions left nothing to train on but the other report's "not
    # relevant" verdicts (docs/BENCHMARKS.md 8ap).
    held = [part for q in queries if (part := _query_on(q, held_docs, True)) is not None]
    train_qs = [part for q in queries if (part := _query_on(q, held_docs, False)) is not None]
    records: list[TrainingRecord] = [r for r in base_records if r.doc_id not in held_docs]
    # explicit "not relevant" verdicts are the hardest negatives there are; they come
    # before the queries' records, so that dedupe keeps them (the first of equals wins)
    # over the same page drawn as a pool or document negative
    for (question, answer, doc_id, page), relevant in resolved.items():
        if relevant or doc_id in held_docs:
            continue
        p = engine.backend.get_page(doc_id, page)
        if p is not None and p.text:
            records.append(TrainingRecord(question, answer, p.text, 0, doc_id, page, "feedback"))
    records.extend(records_from_queries(train_qs, engine, negatives_per_query=negatives_per_query, stage=stage,
                                        seed=seed))
    return SplitData(dedupe(records), train_qs, held, held_docs)


@dataclass
class ModelScore:
    p_at_3: float | None
    r_at_3: float | None
    ece: float | None
    queries: int
    per_query_p3: tuple[float, ...] = ()  # P@3 of each held-out query, in the queries' order
    query_documents: tuple[str, ...] = ()  # the document of each (the first, for a query over several)
    # at the threshold searches use (EVIDENTIA_CLASSIFIER_THRESHOLD): the share of the
    # unthresholded R@3 kept and of the pool's pages returned (the threshold's goals)
    threshold: float | None = None
    recall_kept: float | None = None
    pool_share: float | None = None
    # reported with the decision, not gated on: P@1 of few held-out queries moves by a whole
    # query at a time, and the gate's rule was measured on P@3 (docs/BENCHMARKS.md 6b)
    p_at_1: float | None = None
    # of ``queries``, those with a page judged relevant in their pool: on the others (every
    # verdict "not relevant", or the relevant pages outside the pool) P@3 is 0 for any model,
    # so they cannot show a drop; None: all of them
    with_relevant: int | None = None

    def as_dict(self) -> dict:
        out = {"P@1": self.p_at_1, "P@3": self.p_at_3, "R@3": self.r_at_3, "ECE": self.ece, "queries": self.queries}
        if self.threshold is not None:
            out.update({"t": self.threshold, "R@3_kept_at_t": self.recall_kept, "pool_share_at_t": self.pool_share})
        return out

    def at_threshold(self) -> str:
        """What t does to these queries, in words ('' without a threshold)."""
        if self.threshold is None or self.pool_share is None:
            return ""
        kept = ("has no R@3 to keep (no relevant page in any top 3)" if self.recall_kept is None
                else f"keeps {self.recall_kept:.0%} of R@3")
        return f"at t = {self.threshold:g} it {kept} and returns {self.pool_share:.0%} of the pool"


def evaluate_model(reranker, queries: Sequence[EvalQuery], engine: "Engine", pool_size: int = 20,
                   stage: str = "bm25", threshold: float | None = None) -> ModelScore:
    """P@3/R@3 of the reranked ``stage`` pool (no threshold) and ECE over its pages;
    with ``threshold``, also the share of that R@3 it keeps and of the pages it returns."""
    p1, p3, r3, probs, labels = [], [], [], [], []
    r3_at_t, returned, pooled = [], 0, 0
    judging = 0  # queries with a page judged relevant in their pool: the only ones that can show a drop
    for q in queries:
        query = engine.query(q.question, q.answer)
        pages = reranker.rerank(query, first_stage_pool(engine, query, q.doc_ids, stage, pool_size)).pages
        ranking = [(p.doc_id, p.page) for p in pages]
        # a verdict may be on a page the search never returned (the evidence an analyst found by
        # reading further): outside the pool, it leaves P@3 at 0 for any model
        judging += any(page in q.relevant for page in ranking)
        p1.append(precision_at_k(ranking, q.relevant, 1))
        p3.append(precision_at_k(ranking, q.relevant, 3))
        r = recall_at_k(ranking, q.relevant, 3)
        if r is not None:
            r3.append(r)
        if threshold is not None:
            kept = [(p.doc_id, p.page) for p in pages if p.probability is None or p.probability >= threshold]
            returned, pooled = returned + len(kept), pooled + len(pages)
            if r is not None:
                r3_at_t.append(recall_at_k(kept, q.relevant, 3))
        for p in pages:
            if p.probability is not None:
                probs.append(p.probability)
                labels.append(int((p.doc_id, p.page) in q.relevant))
    mean = lambda xs: round(sum(xs) / len(xs), 4) if xs else None  # noqa: E731
    ece = expected_calibration_error(probs, labels) if probs else None
    kept_share = round(sum(r3_at_t) / sum(r3), 4) if threshold is not None and sum(r3) else None
    return ModelScore(mean(p3), mean(r3), round(ece, 4) if ece is not None else None, len(queries), tuple(p3),
                      tuple(sorted(q.doc_ids)[0] if q.doc_ids else q.id for q in queries), threshold, kept_share,
                      round(returned / pooled, 4) if pooled else None, mean(p1), judging)


@dataclass
class GateDecision:
    promote: bool
    reason: str
    candidate: dict = field(default_factory=dict)
    production: dict = field(default_factory=dict)


# How sure a drop of P@3 on the held-out queries must be to keep production: the share
# of paired resamples of their documents in which the candidate is lower. The held-out
# split is a few documents' queries (10-14 in docs/BENCHMARKS.md section 6b), where one
# page is a drop of 0.02-0.03: blocking on any drop turned down every features candidate
# of the simulated feedback loop, each 0.07-0.09 of P@3 better than production on 27
# queries no round saw.
GATE_DROP_CONFIDENCE = 0.9
_GATE_RESAMPLES = 2000
# Resampling documents needs a few of them: with one or two held-out documents (a
# supplier's two reports hold one out) every resample draws the same one, and a single
# page lost read as a drop "in 100 % of resamples". Below this, queries are resampled.
MIN_DOCUMENTS_TO_RESAMPLE = 3


def drop_confidence(candidate: Sequence[float], production: Sequence[float], documents: Sequence[str] = (),
                    seed: int = 0) -> float:
    """Share of paired bootstrap resamples with the candidate's mean below
    production's (seeded: the same answer every round). With ``documents`` (one per
    query) whole documents are resampled, as the split holds out documents: ten
    queries on three documents are three pieces of evidence, not ten; with fewer than
    MIN_DOCUMENTS_TO_RESAMPLE documents, queries are."""
    import random

    rng = random.Random(seed)
    diffs = [c - p for c, p in zip(candidate, production)]
    if len(set(documents)) < MIN_DOCUMENTS_TO_RESAMPLE:
        documents = ()
    by_document: dict[str, float] = defaultdict(float)  # the summed difference of each document's queries
    for i, d in enumerate(diffs):
        by_document[documents[i] if len(documents) == len(diffs) else str(i)] += d
    totals = list(by_document.values())
    n = len(totals)
    lower = sum(sum(totals[rng.randrange(n)] for _ in range(n)) < -1e-9 for _ in range(_GATE_RESAMPLES))
    return lower / _GATE_RESAMPLES


def gate(candidate: ModelScore, production: ModelScore, ece_margin: float = 0.02,
         drop_confidence_needed: float = GATE_DROP_CONFIDENCE, min_queries: int = 0) -> GateDecision:
    """Promote unless the held-out queries show the candidate worse: P@3 lower in at
    least ``drop_confidence_needed`` of paired resamples of their documents (any drop,
    without per-query scores), or ECE worse by more than ``ece_margin``; and not on
    fewer than ``min_queries`` of them with a page judged relevant
    (EVIDENTIA_RETRAIN_MIN_HELDOUT_QUERIES), which can show no drop either way."""
    if candidate.queries == 0:
        return GateDecision(False, "no held-out feedback query to evaluate on: production kept",
                            candidate.as_dict(), production.as_dict())
    cp, pp = candidate.p_at_3 or 0.0, production.p_at_3 or 0.0
    # only queries with a relevant page count: ten held-out queries whose every verdict
    # was "not relevant" scored P@3 0 -> 0 and promoted a candidate nothing had judged
    judging = candidate.queries if candidate.with_relevant is None else candidate.with_relevant
    if judging < min_queries:
        # said: "promote it anyway" read as an invitation after a candidate lower on every query seen
        trend = "lower" if cp + 1e-9 < pp else "higher" if cp > pp + 1e-9 else "the same"
        unjudged = (f" with a page judged relevant (of {candidate.queries}; on the others P@3 is 0 for any model)"
                    if judging < candidate.queries else "")
        return GateDecision(False, f"only {judging} held-out feedback quer"
                            f"{'y' if judging == 1 else 'ies'}{unjudged} to judge it (P@3 {pp:.3f} -> {cp:.3f}, "
                            f"{trend} on {'it' if candidate.queries == 1 else 'them'}); "
                            f"promotion needs {min_queries} (EVIDENTIA_RETRAIN_MIN_HELDOUT_QUERIES): production kept, "
                            "the candidate registered (`evidentia models promote VERSION` to use it anyway)",
                            candidate.as_dict(), production.as_dict())
    noise = ""
    if cp + 1e-9 < pp:
        paired = len(candidate.per_query_p3) == len(production.per_query_p3) == candidate.queries
        documents = candidate.query_documents if candidate.query_documents == production.query_documents else ()
        if len(set(documents)) < MIN_DOCUMENTS_TO_RESAMPLE:
            documents = ()  # too few to resample (drop_confidence): by query
        sure = drop_confidence(candidate.per_query_p3, production.per_query_p3, documents) if paired else 1.0
        # the resampled unit is a query's first document (ModelScore.query_documents): a
        # query over several held-out documents is one unit, so this count can be lower
        # than the held-out documents the round logs
        sample = (f"{candidate.queries} held-out queries" +
                  (f" in {len(set(documents))} group(s) by first document" if documents else ""))
        if sure >= drop_confidence_needed:
            return GateDecision(False, f"P@3 would drop from {pp:.3f} to {cp:.3f}" +
                                (f" (lower in {sure:.0%} of resamples of the {sample})" if paired else "") +
                                ": production kept", candidate.as_dict(), production.as_dict())
        noise = f" (lower in {sure:.0%} of resamples of the {sample}: within their noise)"
    ce, pe = candidate.ece, production.ece
    if ce is not None and pe is not None and ce > pe + ece_margin:
        return GateDecision(False, f"ECE would worsen from {pe:.3f} to {ce:.3f} (margin {ece_margin}): production kept",
                            candidate.as_dict(), production.as_dict())
    ece = f", ECE {pe:.3f} -> {ce:.3f}" if ce is not None and pe is not None else ""
    return GateDecision(True, f"P@3 {pp:.3f} -> {cp:.3f}{noise}{ece}: candidate promoted",
                        candidate.as_dict(), production.as_dict())


def calibrate_on_pools(candidate, model_dir: Path, queries: Sequence[EvalQuery], engine: "Engine",
                       log: Callable[[str], None] = print, pool_size: int = 20, stage: str = "bm25") -> None:
    """Refit the candidate's calibration on the ``stage`` pools of its training queries
    (margin and place in the pool, training/calibrate.py), as the shipped model was,
    so candidate and production are compared on equal terms. ``candidate``: the
    loaded ClassifierReranker of ``model_dir``; its calibration is updated in memory
    and in the directory. Pages of a pool without a "relevant" verdict count as not
    relevant, as in the training records. Skipped, keeping the Platt fit of
    training, when no pool holds a relevant page."""
    from evidentia.training.calibrate import CalibrationError, calibrate, score_pools

    if not queries:
        return
    pools = [(q, first_stage_pool(engine, engine.query(q.question, q.answer), q.doc_ids, stage, pool_size))
             for q in queries]
    try:
        result = calibrate(model_dir, score_pools(candidate, pools), [stage], "feedback")
    except CalibrationError as exc:
        log(f"pool calibration skipped: {exc}")
        return
    candidate.metadata.calibration = result.calibration
    log(f"calibrated on {result.pages} pool pages of {result.queries} feedback queries "
        f"(rank weight {result.calibration.rank_weight:+.3f})")


@dataclass
class RetrainResult:
    version: str | None
    decision: GateDecision
    train_records: int
    held_out_queries: int


class UnchangedTrainingData(TrainingError):
    """The round's training records, base model and settings are those a registered
    version was trained on: the candidate would be that version again (training is
    seeded), so no new version is registered. ``same_as`` names it."""

    def __init__(self, message: str, same_as: ModelEntry) -> None:
        super().__init__(message)
        self.same_as = same_as


def trained_alike(registry: ModelRegistry, digest: str, base_model: str, kind: str, params: TrainParams,
                  recipe: "TrainingRecipe | None") -> ModelEntry | None:
    """The latest registered version trained on records of this ``digest`` with this base
    model, kind and the settings that kind reads (a lora's TrainParams, a features model's
    recipe), or None."""
    from evidentia.reranker.classifier_model import ModelMetadata

    for entry in reversed(registry.entries()):
        if entry.data_sha256 != digest or entry.base_model != base_model:
            continue
        try:
            extra = ModelMetadata.read(entry.path).extra
        except Exception:  # noqa: BLE001 (a version whose files are gone is no twin)
            continue
        if extra.get("kind", "lora") != kind:
            continue
        if kind == "features" and extra.get("recipe") != (recipe.to_dict() if recipe else None):
            continue
        if kind != "features" and extra.get("params") != asdict(params):
            continue
        return entry
    return None


def retrain(verdicts: Sequence[Verdict], base_records: Sequence[TrainingRecord], engine: "Engine",
            registry: ModelRegistry, base_model: str,
            load_reranker: Callable[[Path | None], object], params: TrainParams = TrainParams(),
            held_out_fraction: float = 0.3, ece_margin: float = 0.02, seed: int = 0,
            log: Callable[[str], None] = print, kind: str = "lora",
            recipe: "TrainingRecipe | None" = None, force: bool = False) -> RetrainResult:
    """One retraining round. ``load_reranker(path)`` builds a ClassifierReranker with
    no threshold for a model directory (None: the current default model). ``kind``:
    ``lora`` fine-tunes ``base_model``; ``features`` fits the feature-based model
    (training/train_features.py), which is calibrated as fitted (no pool calibration),
    with ``recipe``'s document prefixes (those the model in use was trained with).
    The negatives, the pool calibration and the gate's pools come from the first stage
    the reranker sits behind (EVIDENTIA_STAGE: hybrid with dense retrieval on): judged
    behind BM25, good candidates of the default setup were turned down
    (docs/BENCHMARKS.md section 6b). A round on the records, base model and settings a
    registered version was trained on raises UnchangedTrainingData (``force``: trains
    and judges it again): a scheduled round after a restart, or `evidentia retrain` run
    twice, registered the same model as a new version each time."""
    stage = str(engine.settings.stage)
    data = build_training_set(verdicts, base_records, engine, held_out_fraction, seed=seed, stage=stage)
    # named: their verdicts judge candidates and never train one (the same documents every round)
    held = sorted(split_internal_id(d)[1] for d in data.held_out_docs)
    named = listed(held, 5)
    log(f"{len(data.train_records)} training records ({len(data.train_queries)} feedback queries); "
        f"{len(data.held_out_queries)} held-out quer{'y' if len(data.held_out_queries) == 1 else 'ies'}, "
        f"touching {len(data.held_out_docs)} held-out document(s)"
        + (f": {named} (judged on, never trained on)" if held else ""))
    if not data.train_records:
        why = (f"every feedback query ({len(data.held_out_queries)}) is held out for the promotion gate (their "
               f"{len(data.held_out_docs)} document(s) are held out; a lone document always is)"
               if not data.train_queries else f"the {len(data.train_queries)} training queries gave none")
        raise TrainingError(f"no training records: {why}; give base training records (--base-data FILE or "
                            "EVIDENTIA_RETRAIN_BASE_DATA), or feedback on more documents")
    with tempfile.TemporaryDirectory(dir=registry.root.parent if registry.root.parent.exists() else None) as tmp:
        data_file = Path(tmp) / "train.jsonl"
        digest = write_records(data.train_records, data_file)
        out = Path(tmp) / "candidate"
        if kind == "features":
            from evidentia.training.train_features import TrainingRecipe

            recipe = recipe or TrainingRecipe()
        twin = None if force else trained_alike(registry, digest, base_model, kind, params, recipe)
        if twin is not None:
            raise UnchangedTrainingData(
                f"nothing new to learn: these {len(data.train_records)} training records (sha256 {digest[:12]}) "
                f"are those {twin.version} was trained on ({twin.status}; `evidentia models list` shows the gate's "
                "reason): no version registered. Retrain after new verdicts, or with --force to train and judge "
                "it again", twin)
        if kind == "features":
            from evidentia.training.train_features import train_features

            if recipe != TrainingRecipe():
                log(f"the recipe of the model in use: {json.dumps(recipe.to_dict())}")

            verdict_docs = frozenset(d for q in data.train_queries for d in q.doc_ids)
            # t must keep the evidence of the analysts' queries and of the base data's
            # apart: 40 report queries graded page by page outvoted 34 filings' pooled,
            # and t rose from 0.07 to 0.195 (docs/BENCHMARKS.md 8ab)
            train_features(data.train_records, out, base_model=base_model, data_sha256=digest, seed=seed, log=log,
                           backend=engine.backend, recipe=recipe, own_docs=verdict_docs,
                           threshold_group=lambda doc_id: "verdicts" if doc_id in verdict_docs else "base")
            candidate = load_reranker(out)
        else:
            train(data.train_records, base_model, out, params, data_sha256=digest, log=log)
            candidate = load_reranker(out)
            calibrate_on_pools(candidate, out, data.train_queries, engine, log, stage=stage)
        production = registry.production()
        # what the threshold searches use does to the held-out documents: said, not gated on
        t = engine.settings.classifier_threshold
        cand_score = evaluate_model(candidate, data.held_out_queries, engine, stage=stage, threshold=t)
        prod_score = evaluate_model(load_reranker(production.path if production else None),
                                    data.held_out_queries, engine, stage=stage, threshold=t)
        if cand_score.p_at_1 is not None and prod_score.p_at_1 is not None:
            log(f"held-out P@1 {prod_score.p_at_1:.3f} -> {cand_score.p_at_1:.3f} (reported; the gate reads P@3 "
                "and ECE)")
        for name, score in (("candidate", cand_score), ("production", prod_score)):
            if score.at_threshold():
                log(f"{name} on the held-out queries: {score.at_threshold()}")
        decision = gate(cand_score, prod_score, ece_margin,
                        min_queries=engine.settings.retrain_min_heldout_queries)
        entry = registry.register(out, note=decision.reason)
    registry_metrics = {"held_out": decision.candidate, "production_on_same_split": decision.production}
    log(f"candidate {entry.version}: {decision.reason}")
    if decision.promote:
        registry.promote(entry.version, reason=decision.reason)
    registry.update_metrics(entry.version, registry_metrics)
    return RetrainResult(entry.version, decision, len(data.train_records), len(data.held_out_queries))

