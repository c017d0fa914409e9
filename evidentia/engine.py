"""The engine: the one place a search is assembled.

It owns the search backend, the language detector, the shared embedder and the
loaded rerankers, checks a run's options once (``Engine.config``), and runs one
query through a first stage and a reranker (``Engine.run``). The CLI, the API,
evaluation, training and distillation all go through it::

    question + answer --build_query--> Query(text, keywords, language)
        --first stage (bm25 | dense | hybrid = bm25 + dense, RRF-joined)--> candidates
        --reranker (none | llm | classifier @ threshold)--> ranked pages -> SearchResult
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from evidentia.config import STAGES, ConfigError, Settings
from evidentia.language import LanguageDetector
from evidentia.records import Candidate, Query, RankedPage
from evidentia.reranker.base import NoReranker, Reranker, RerankResult
from evidentia.reranker.cache import RerankerCache
from evidentia.reranker.registry import reranker_class, reranker_names
from evidentia.runtime import ComputeGate, usable_cpus
from evidentia.retriever.base import MissingVectorsError, SearchBackend, UnknownDocumentError
from evidentia.retriever.query import build_query
from evidentia.retriever.stages import BM25Retriever, DenseRetriever, FirstStage, HybridRetriever

log = logging.getLogger("evidentia.engine")

if TYPE_CHECKING:  # pragma: no cover
    from evidentia.indexer.ocr import OcrEngine
    from evidentia.indexing import IndexSummary
    from evidentia.retriever.dense import PageEmbedder


class RunConfigError(ConfigError):
    """Run options that cannot be used; ``problems`` lists (option, message) so
    each entry point names the option its own way (``--top-k``, ``body.top_k``)."""

    def __init__(self, problems: Sequence[tuple[str, str]]):
        self.problems = list(problems)
        super().__init__("; ".join(f"{option}: {message}" for option, message in self.problems))


@dataclass(frozen=True)
class RunConfig:
    """What one search runs: a first stage, a reranker and its threshold, a pool size."""

    stage: str = "bm25"
    reranker: str = "none"
    threshold: float | None = None  # None: the reranker keeps every page it ranks
    pool_size: int = 20
    # The default stage (hybrid, nobody asked for it) searches documents without page
    # vectors with bm25 and says so; a stage asked for raises MissingVectorsError.
    bm25_fallback: bool = False

    @property
    def label(self) -> str:
        """``stage[+reranker][@threshold]``, the form ``parse_config`` reads."""
        label = self.stage if self.reranker == "none" else f"{self.stage}+{self.reranker}"
        return f"{label}@{self.threshold:g}" if self.threshold is not None else label


def parse_config(spec: str, pool_size: int = 20) -> RunConfig:
    """``[stage+]reranker[@threshold]``; a bare stage means no reranker, a bare
    reranker runs on the bm25 stage (``classifier@0.15`` = ``bm25+classifier@0.15``)."""
    spec = spec.strip()
    if not spec:
        raise ConfigError("empty configuration")
    body, _, thr = spec.partition("@")
    threshold = None
    if thr:
        try:
            threshold = float(thr)
        except ValueError:
            raise ConfigError(f"{spec!r}: threshold {thr!r} is not a number") from None
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"{spec!r}: threshold must be between 0 and 1")
    parts = [p.strip() for p in body.split("+") if p.strip()]
    stage, reranker = "bm25", "none"
    if len(parts) == 1:
        if parts[0] in STAGES:
            stage = parts[0]
        else:
            reranker = parts[0]
    elif len(parts) == 2:
        stage, reranker = parts
    else:
        raise ConfigError(f"{spec!r}: expected [stage+]reranker[@threshold]")
    if stage not in STAGES:
        raise ConfigError(f"{spec!r}: unknown first stage {stage!r}; choose one of {', '.join(STAGES)}")
    if reranker not in reranker_names():
        raise ConfigError(f"{spec!r}: unknown reranker {reranker!r}; choose one of {', '.join(reranker_names())}")
    if threshold is not None and not reranker_class(reranker).outputs_probabilities:
        raise ConfigError(f"{spec!r}: a threshold needs a reranker that outputs probabilities; "
                          f"{reranker!r} does not output probabilities")
    return RunConfig(stage=stage, reranker=reranker, threshold=threshold, pool_size=pool_size)


@dataclass(frozen=True)
class SearchResult:
    query: Query
    candidates: list[Candidate]  # the first-stage pool, best first
    pages: list[RankedPage]  # what the reranker kept, best first
    config: RunConfig
    reranker: str  # the reranker that ran
    fallback_reason: str | None = None  # set when the reranker handed back the first-stage order
    model_version: str | None = None
    info: dict = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    without_vectors: tuple[str, ...] = ()  # set when the default hybrid stage fell back to bm25 for these
    # False where the hybrid stage left BM25 out (EVIDENTIA_HYBRID_WEIGHTS=0,1): no page was
    # looked for by its words, so none can be said to lack them
    words_searched: bool = True

    def with_rerank(self, reranker: Reranker, outcome: RerankResult, rerank_ms: float) -> "SearchResult":
        """This first-stage result with ``reranker``'s outcome on its pool: how every
        search gets its pages, in ``Engine.run`` and after a rerank the API awaited."""
        timings = {**self.timings_ms, "rerank": rerank_ms, "total": self.timings_ms.get("total", 0.0) + rerank_ms}
        return dataclasses.replace(self, pages=outcome.pages, reranker=reranker.name,
                                   fallback_reason=outcome.fallback_reason, model_version=reranker.model_version,
                                   info=outcome.info, timings_ms=timings)

    @property
    def stage(self) -> str:
        """The first stage that built the pool: bm25 when hybrid fell back."""
        return "bm25" if self.without_vectors else self.config.stage

    @property
    def meaning_only_note(self) -> str | None:
        """Said when the hybrid pool holds no page with any of the query's words (BM25
        found none there): "capex" brought back an exhibit list at the same kind of
        score as evidence, and nothing said why. None otherwise."""
        if self.stage != "hybrid" or not self.words_searched or not self.query.keywords or not self.candidates:
            return None
        if any("bm25" in c.found_by or not c.found_by for c in self.candidates):
            return None
        words = ", ".join(self.query.keywords[:8])
        return (f"none of these pages contains any of the words {words}: the hybrid stage found them by meaning "
                "alone, so they may not be evidence; try the words the evidence would use")

    @property
    def note(self) -> str | None:
        """Why no page came back, and what to do about it (None when pages did)."""
        if self.pages:
            return None
        if not self.query.keywords:
            return ("no matching page: the question and answer hold no searchable word (only stop words or "
                    "punctuation); add the words the evidence would use")
        if not self.candidates:
            return ("no matching page: no page of these documents contains any of the words "
                    f"{', '.join(self.query.keywords[:8])}; try other words, or the hybrid stage (finds pages "
                    "by meaning)")
        best = self.info.get("best_probability")
        best_text = f" (the best had p={_below(best, self.config.threshold)})" if best is not None else ""
        n = len(self.candidates)
        which = "the only candidate" if n == 1 else f"all {n} candidates"
        threshold = f" {self.config.threshold:g}" if self.config.threshold is not None else ""
        # the note reaches the CLI, the API and the web page: it names each place t is set, and
        # the best p rounded down, a value that does keep that page (a page is kept at p >= t)
        lower = (f"a threshold of {math.floor(best * 100) / 100:g} keeps the best of them, 0 keeps all"
                 if best is not None and best >= 0.01 else "a threshold of 0 keeps all of them")
        return (f"no page kept: {which} fell below the relevance threshold{threshold}{best_text}; {lower} "
                "(--threshold on the command line, \"threshold\" in the API and on the web page, "
                "EVIDENTIA_CLASSIFIER_THRESHOLD for the default)")


def _below(p: float, threshold: float | None) -> str:
    """``p`` to two decimals, or as many as it takes to read below ``threshold``
    (0.108 under t = 0.11 is not "p=0.11")."""
    for digits in range(2, 7):
        text = f"{p:.{digits}f}"
        if threshold is None or float(text) < threshold:
            return text
    return repr(p)


class Engine:
    """Everything a search needs, opened lazily (``--help`` needs no index) and
    loaded once per process. Safe to share between threads."""

    def __init__(self, settings: Settings, *, backend: SearchBackend | None = None,
                 embedder: "PageEmbedder | None" = None, dense_queries: bool = True) -> None:
        """``backend`` and ``embedder`` are opened from the settings unless given
        (tests and benchmarks share theirs). ``dense_queries`` False refuses the
        dense and hybrid stages up front: a server with EVIDENTIA_DENSE=off loads
        no embedding model. The CLI keeps them, so documents indexed with vectors
        earlier stay searchable and others get a precise missing-vectors error."""
        self.settings = settings
        self.dense_queries = dense_queries
        self._backend = backend
        self._detector: LanguageDetector | None = None
        self._embedder = embedder
        self._ocr: "OcrEngine | None" = None
        self._lock = threading.Lock()
        # rerankers that encode text share the engine's embedder: one model per process
        self.rerankers = RerankerCache(settings, shared_embedder=lambda: self.embedder)
        # searches share the cores: admitted all at once, each took as long as all of them
        self.search_gate = ComputeGate(settings.search_concurrency or usable_cpus())

    # -- parts -----------------------------------------------------------------
    @property
    def backend(self) -> SearchBackend:
        """The configured search backend; ConfigError / BackendError when it cannot be opened."""
        if self._backend is None:
            from evidentia.retriever.factory import open_backend

            with self._lock:
                if self._backend is None:
                    self._backend = open_backend(self.settings)
        return self._backend

    @property
    def backend_open(self) -> bool:
        return self._backend is not None

    @property
    def detector(self) -> LanguageDetector:
        # each detection makes its own seeded langdetect Detector, so threads can share one
        if self._detector is None:
            self._detector = LanguageDetector(probe_chars=self.settings.language_probe_chars)
        return self._detector

    @property
    def embedder(self) -> "PageEmbedder":
        """The page/query embedder (EVIDENTIA_DENSE_MODEL), shared by indexing and
        search; creating it costs nothing, its model loads on first use."""
        if self._embedder is None:
            from evidentia.retriever.dense import SharedEmbedder

            with self._lock:
                if self._embedder is None:
                    try:
                        self._embedder = SharedEmbedder.from_settings(self.settings)
                    except ValueError as exc:
                        raise ConfigError(f"EVIDENTIA_DENSE_*: {exc}") from None
        return self._embedder

    @property
    def ocr(self) -> "OcrEngine":
        """OCR of scanned pages while indexing (EVIDENTIA_OCR*): Tesseract is probed
        once; where it is missing, scanned pages are indexed unread and counted.
        ConfigError where EVIDENTIA_OCR_LANGUAGES names no Tesseract language; a
        language whose pack is not installed is a warning."""
        if self._ocr is None:
            from evidentia.indexer.ocr import OcrEngine

            with self._lock:
                if self._ocr is None:
                    ocr = OcrEngine.from_settings(self.settings)
                    error, warning = ocr.language_problems()
                    if error:  # not kept: each use says it again
                        raise ConfigError(error)
                    if warning:
                        log.warning("%s", warning)
                    if self.settings.ocr != "off" and not ocr.available:
                        log.warning("OCR unavailable, scanned pages will be indexed unread: %s", ocr.problem)
                    self._ocr = ocr
        return self._ocr

    @property
    def indexing_embedder(self) -> "PageEmbedder | None":
        """The embedder used while indexing; None with EVIDENTIA_DENSE=off."""
        return self.embedder if self.settings.dense else None

    def load_embedder(self) -> "PageEmbedder":
        """The embedder with its model loaded; EmbeddingError (a ConfigError) when it cannot be."""
        embedder = self.embedder
        if not embedder.loaded:
            embedder.load()  # once, under the embedder's lock (the ONNX export on first use, then cached)
        return embedder

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()

    # -- run options -----------------------------------------------------------
    def config(self, *, stage: str | None = None, reranker: str | None = None, threshold: float | None = None,
               pool_size: int | None = None) -> RunConfig:
        """The one place run options are checked and defaulted: the stage
        (EVIDENTIA_STAGE), the reranker (EVIDENTIA_DEFAULT_RERANKER), its threshold
        (EVIDENTIA_CLASSIFIER_THRESHOLD for a reranker that outputs probabilities),
        the pool size (EVIDENTIA_POOL_SIZE, at most EVIDENTIA_MAX_TOP_K).
        Raises RunConfigError naming each bad option."""
        s = self.settings
        problems: list[tuple[str, str]] = []
        source = "" if stage else " (the default, EVIDENTIA_STAGE)"
        fallback = not stage
        stage = (stage or s.stage).strip().lower()
        if stage not in STAGES:
            problems.append(("stage", f"must be one of {', '.join(STAGES)}, not {stage!r}"))
        elif stage != "bm25" and not self.dense_queries:
            problems.append(("stage", f"the {stage} stage{source} needs dense retrieval, which is off here: "
                             "enable it with EVIDENTIA_DENSE=on (and index the documents again so that their "
                             "pages get embeddings), or use the bm25 stage"))
        name = (reranker or s.default_reranker).strip().lower()
        cls = None
        if name not in reranker_names():
            # read after the option's name: "--reranker must be one of ..."
            problems.append(("reranker", f"must be one of {', '.join(reranker_names())}, not {name!r}"))
        else:
            cls = reranker_class(name)
        if threshold is not None:
            if not 0.0 <= threshold <= 1.0:
                problems.append(("threshold", "must be between 0 and 1"))
            elif cls is not None and not cls.outputs_probabilities:
                # read after the flag or field: "--threshold needs ...", "threshold: needs ..."
                problems.append(("threshold", f"needs a reranker that outputs probabilities (e.g. classifier); "
                                 f"the reranker here is {name}"))
        elif cls is not None and cls.outputs_probabilities:
            threshold = s.classifier_threshold
        pool = s.pool_size if pool_size is None else pool_size
        if pool <= 0:
            problems.append(("pool_size", "must be a positive integer"))
        elif pool > s.max_top_k:
            problems.append(("pool_size", f"at most {s.max_top_k} (EVIDENTIA_MAX_TOP_K), got {pool}"))
        if problems:
            raise RunConfigError(problems)
        return RunConfig(stage=stage, reranker=name, threshold=threshold, pool_size=pool,
                         bm25_fallback=fallback and stage == "hybrid")

    def check_text(self, question: str, answer: str) -> None:
        """The limits on a question and its answer, the same for the CLI and the API
        (EVIDENTIA_MAX_QUESTION_CHARS, EVIDENTIA_MAX_ANSWER_CHARS). RunConfigError otherwise."""
        s = self.settings
        problems: list[tuple[str, str]] = []
        if not question.strip():
            problems.append(("question", "must not be blank"))
        if len(question) > s.max_question_chars:
            problems.append(("question", f"at most {s.max_question_chars} characters (got {len(question)}; "
                             "EVIDENTIA_MAX_QUESTION_CHARS)"))
        if len(answer) > s.max_answer_chars:
            problems.append(("answer", f"at most {s.max_answer_chars} characters (got {len(answer)}; "
                             "EVIDENTIA_MAX_ANSWER_CHARS)"))
        if problems:
            raise RunConfigError(problems)

    # -- search ----------------------------------------------------------------
    def query(self, question: str, answer: str = "") -> Query:
        return build_query(question, answer, self.detector)

    def first_stage(self, stage: str) -> FirstStage:
        if stage not in STAGES:
            raise ConfigError(f"unknown first stage {stage!r}; choose one of {', '.join(STAGES)}")
        bm25 = BM25Retriever(self.backend)
        if stage == "bm25":
            return bm25
        dense = DenseRetriever(self.backend, self.embedder)
        if stage == "dense":
            return dense
        s = self.settings
        return HybridRetriever(bm25, dense, weights=tuple(s.hybrid_weights), rrf_k=s.rrf_k, depth=s.hybrid_depth)

    def retrieve(self, query: Query, doc_ids: Sequence[str], stage: str, pool_size: int,
                 timings: dict[str, float] | None = None) -> list[Candidate]:
        """The first-stage pool, best first, at most ``pool_size`` pages."""
        return self.first_stage(stage).retrieve(query, doc_ids, pool_size, timings)

    def retrieve_or_bm25(self, query: Query, doc_ids: Sequence[str], stage: str, pool_size: int,
                         timings: dict[str, float] | None = None) -> tuple[list[Candidate], tuple[str, ...]]:
        """The ``stage`` pool, or BM25's when a document has no page vectors (indexed
        with dense retrieval off); with the ids of those documents."""
        try:
            return self.retrieve(query, doc_ids, stage, pool_size, timings), ()
        except MissingVectorsError as exc:
            return self.retrieve(query, doc_ids, "bm25", pool_size, timings), tuple(exc.doc_ids)

    def reranker(self, config: RunConfig) -> Reranker:
        """The loaded reranker of ``config`` (created once, then shared)."""
        return self.rerankers.get(config.reranker, config.threshold)

    def run(self, query: Query, doc_ids: Sequence[str], config: RunConfig, *,
            reranker: Reranker | None = None, deadline: float | None = None) -> SearchResult:
        """One query through the first stage and the reranker. ``reranker``
        overrides the configured one (evaluation passes its own); ``deadline``
        (time.monotonic()) bounds the wait for a search slot and a local-compute
        slot (TimeoutError; Overloaded at once when the line would not reach it in
        time: runtime.ComputeGate) and a reranker that ``takes_deadline`` (the LLM
        falls back by it)."""
        t0 = time.perf_counter()
        reranker = reranker if reranker is not None else self.reranker(config)
        first, rerank_ms, outcome = self._run(query, doc_ids, config, reranker, deadline, t0)
        return first.with_rerank(reranker, outcome, rerank_ms)

    def run_awaiting(self, query: Query, doc_ids: Sequence[str], config: RunConfig, *, reranker: Reranker,
                     deadline: float | None = None) -> tuple[SearchResult, Reranker | None]:
        """``run`` for a caller that awaits a remote reranker itself (the API, so that
        an LLM's minutes hold no thread of its pool): a local reranker runs here, as in
        ``run``; one that ``takes_deadline`` is handed back with the first-stage result,
        which the caller completes with ``SearchResult.with_rerank``."""
        if not reranker.takes_deadline:
            return self.run(query, doc_ids, config, reranker=reranker, deadline=deadline), None
        # the first stage's order until then: a complete result on its own
        passthrough = NoReranker()
        first, rerank_ms, outcome = self._run(query, doc_ids, config, passthrough, deadline, time.perf_counter())
        return first.with_rerank(passthrough, outcome, rerank_ms), reranker

    def _run(self, query: Query, doc_ids: Sequence[str], config: RunConfig, reranker: Reranker,
             deadline: float | None, t0: float) -> tuple[SearchResult, float, RerankResult]:
        """The first-stage result (no pages yet; its timings from ``t0``, before the
        reranker was loaded), the rerank's milliseconds and its outcome."""
        loaded = time.perf_counter()
        timings: dict[str, float] = {}
        # the first stage and a local reranker hold one of the engine's search slots (an LLM
        # reranker the API awaits outside this call: it is passed here as NoReranker)
        with self.search_gate.enter(deadline) as waited_search:
            t1 = time.perf_counter()
            without: tuple[str, ...] = ()
            if not query.keywords:
                # only stop words or punctuation ("???"): BM25 finds nothing, and the nearest
                # pages to such a text's embedding mean nothing either. No index search then, which
                # is where an unknown document is found otherwise: looked up here, or "no searchable
                # word" hid a wrong document id
                unknown = [d for d in dict.fromkeys(doc_ids) if self.backend.get_document(d) is None]
                if unknown:
                    raise UnknownDocumentError(unknown)
                candidates = []
            elif config.bm25_fallback:
                candidates, without = self.retrieve_or_bm25(query, doc_ids, config.stage, config.pool_size,
                                                            timings)
            else:
                candidates = self.retrieve(query, doc_ids, config.stage, config.pool_size, timings)
            t2 = time.perf_counter()
            with self.rerankers.gate(reranker, deadline) as waited:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError
                t3 = time.perf_counter()
                reranker.attach_backend(self.backend)  # rerankers that read page vectors stored at indexing time
                if reranker.takes_deadline and deadline is not None:  # the LLM: bounded by the same deadline
                    outcome = reranker.rerank(query, candidates, deadline=deadline)
                else:
                    outcome = reranker.rerank(query, candidates)
        t4 = time.perf_counter()
        timings.update({"load": (loaded - t0) * 1000, "retrieve": (t2 - t1) * 1000,
                        "queue": (waited_search + waited) * 1000, "total": (t3 - t0) * 1000})
        first = SearchResult(query=query, candidates=candidates, pages=[], config=config, reranker="none",
                             timings_ms=timings, without_vectors=without,
                             words_searched=config.stage != "hybrid" or self.settings.hybrid_weights[0] > 0)
        return first, (t4 - t3) * 1000, outcome

    def search(self, question: str, answer: str, doc_ids: Sequence[str], config: RunConfig,
               **kwargs) -> SearchResult:
        return self.run(self.query(question, answer), doc_ids, config, **kwargs)

    # -- indexing --------------------------------------------------------------
    def index_paths(self, paths: Sequence[Path], progress: bool = True,
                    doc_id_of: Callable[[Path], str] | None = None) -> "IndexSummary":
        """Index PDFs (files or folders), with page embeddings unless EVIDENTIA_DENSE=off;
        a document's id is ``doc_id_of(path)`` (default: the file's stem)."""
        from evidentia.indexer.worker import ExtractionLimits
        from evidentia.indexing import index_paths_with_progress

        # bounded like the API's uploads (EVIDENTIA_EXTRACT_*, EVIDENTIA_MAX_*): a hostile file is one failure
        return index_paths_with_progress(paths, self.backend, self.detector, embedder=self.indexing_embedder,
                                         show=progress, doc_id_of=doc_id_of or (lambda path: path.stem),
                                         every_s=self.settings.progress_interval_s, ocr=self.ocr,
                                         limits=ExtractionLimits.from_settings(self.settings))

    def missing_documents(self, doc_ids: Sequence[str]) -> list[str]:
        indexed = {d.doc_id for d in self.backend.list_documents()}
        return sorted(d for d in dict.fromkeys(doc_ids) if d not in indexed)

    def index_missing(self, doc_ids: Sequence[str], pdf_dir: Path, progress: bool = True) -> "IndexSummary | None":
        """Index, from ``pdf_dir`` (searched recursively), the PDFs whose document id
        (``store.document_id_for`` of the file name, as `evidentia index` and uploads
        give it) is one of ``doc_ids`` that the index lacks; None when nothing needed
        indexing. Indexed like any other document (page embeddings included), so every
        stage can search them afterwards."""
        from evidentia.indexing import pdfs_by_document_id

        missing = set(self.missing_documents(doc_ids))
        if not missing:
            return None
        # by id, not by stem: the stem of "Rapport 2023 é.pdf" is no id, and indexed under
        # it the document was one that neither `evidentia index` nor the API can name
        chosen = {path: doc_id for doc_id, path in pdfs_by_document_id([pdf_dir]).items() if doc_id in missing}
        if not chosen:
            return None
        return self.index_paths(list(chosen), progress=progress, doc_id_of=chosen.__getitem__)
