"""OCR for pages without a usable text layer: scans, and text layers that are glyph junk.

Tesseract runs as a subprocess (the ``tesseract`` command line, TSV output) on the
page rendered by PyMuPDF. bench/bench_ocr.py compared it with PyMuPDF's built-in
OCR (``Page.get_textpage_ocr``, the same Tesseract engine linked into MuPDF): the
command line was 1.5-2x faster on the same renders with the same word accuracy,
it reports a confidence per word (MuPDF's OCR device reports none), and a
subprocess can be killed at a time limit and cannot take the indexer down with it.
ocrmypdf is a whole-file tool that rewrites the PDF around the same Tesseract
command line, so per page it could only be slower.

Everything here is a pure function of (page, engine, language): ``read_page``
decides whether a page needs OCR and returns ``PageText(text, source,
confidence)``; it keeps no state between calls, so a worker process can call it
unchanged. ``OcrEngine`` is a frozen, picklable description of the Tesseract
install (probed once by the entry point with ``OcrEngine.probe``).

``read_page`` is two steps, which indexer/pdf.py uses apart to read several
pages at once: ``prepare_page`` (the decision, ``decide_page``, and the render,
``render_page``: PyMuPDF, in the calling thread) and ``read_rendered``
(Tesseract's reading of that render, run by a ``TesseractPool``: up to
``OcrEngine.parallel`` processes at once, started and collected by the calling
thread). indexer/pdf.py decides for every page before it renders any, so that its
OCR backlog counts only the pages Tesseract will read.

Page sources (``Page.text_source``):

- ``text``: the PDF's own text layer;
- ``ocr``: read by Tesseract, with its mean word confidence (0-100);
- ``unread``: the page shows something (an image, drawn glyphs, a junk text
  layer) but was not read: OCR off, Tesseract missing, or OCR failed;
- ``none``: nothing on the page to read (blank).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import deque
from itertools import islice
from dataclasses import dataclass, field, replace
from typing import IO, Callable

import pymupdf

from evidentia.config import declared_default
from evidentia.runtime import usable_cpus

OCR_MODES = ("on", "off", "force")
TEXT, OCR, UNREAD, NONE = "text", "ocr", "unread", "none"
SOURCES = (TEXT, OCR, UNREAD, NONE)

# ISO 639-1 (what the language detector says) -> Tesseract traineddata name.
TESSERACT_LANGUAGES = {
    "en": "eng", "fr": "fra", "de": "deu", "es": "spa", "it": "ita", "pt": "por", "nl": "nld",
    "sv": "swe", "da": "dan", "no": "nor", "fi": "fin",
}
DEFAULT_LANGUAGES = declared_default("ocr_languages")
# Tesseract's language models, as Debian and Ubuntu package them (tesseract-ocr-<name>,
# "_" written "-"): a name of EVIDENTIA_OCR_LANGUAGES is one of these or a model installed
# here (one trained in-house has a name of its own); anything else (an ISO code such as
# "fr", a typo) was silently dropped, and the pages read in English.
TESSERACT_MODELS = frozenset("""
    afr amh ara asm aze aze_cyrl bel ben bod bos bre bul cat ceb ces chi_sim chi_sim_vert chi_tra chi_tra_vert
    chr cos cym dan deu div dzo ell eng enm epo est eus fao fas fil fin fra frk frm fry gla gle glg grc guj hat
    heb hin hrv hun hye iku ind isl ita ita_old jav jpn jpn_vert kan kat kat_old kaz khm kir kmr kor kor_vert lao
    lat lav lit ltz mal mar mkd mlt mon mri msa mya nep nld nor oci ori pan pol por pus que ron rus san sin slk slv
    snd spa spa_old sqi srp srp_latn sun swa swe syr tam tat tel tgk tha tir ton tur uig ukr urd uzb uzb_cyrl vie
    yid yor osd equ""".split())  # osd, equ: orientation and script detection, equations
INSTALL_HINT = ("to read them, install Tesseract: apt-get install tesseract-ocr tesseract-ocr-eng "
                "tesseract-ocr-fra tesseract-ocr-deu tesseract-ocr-spa tesseract-ocr-ita tesseract-ocr-por "
                "tesseract-ocr-nld; EVIDENTIA_OCR=off silences this")
MISSING_PROBLEMS = ("Tesseract was not found", "Tesseract has no language data")

# A text layer with fewer letters than this, on a page that shows an image over
# much of its area (or many drawn paths: text turned into outlines), is a scan
# with at most a stamp or page number as text.
SHORT_TEXT_LETTERS = 50
SCAN_IMAGE_COVER = 0.5
# A figure printed as an image, with its caption as the only text layer (BHP's
# Climate Transition Action Plan, page 9: a full-page table of actions and
# emissions by sector under a 21-word caption): a page with fewer letters than
# this that shows an image over SCAN_IMAGE_COVER of its area is read as well, and
# the reading replaces the caption only when it holds FIGURE_GAIN times its
# letters (a photo with a caption keeps its caption).
FIGURE_CAPTION_LETTERS = 300
# Tesseract's words when an allocation fails (a page past the extraction's memory limit)
OUT_OF_MEMORY_WORDS = ("bad_alloc", "Out of memory", "out of memory", "Cannot allocate memory")
FIGURE_GAIN = 2.0
OUTLINED_TEXT_PATHS = 50
# A page drawing more paths than this is not rendered for OCR (left unread, and said
# so): rendering is PyMuPDF's, in the indexing process, and no timeout stops it. A
# 790 KB upload of 350,000 thick strokes on one page took 94 s to render even at
# 36 dpi, and held an indexing worker, and every tenant's queue behind it, for the
# extraction's 300 s. A page of text turned into outlines draws a path a glyph: a
# few thousand.
MAX_OCR_PATHS = 20_000
# Renders above this many pixels are scaled down (a poster-sized page at 300 dpi
# would be hundreds of megapixels).
MAX_PIXELS = 40_000_000
# How often a TesseractPool looks at its processes while it waits for one: a page
# takes seconds, so a free slot or an ended page is noticed within 1% of that.
POLL_S = 0.02


class OcrError(Exception):
    """Tesseract could not read a page (timeout, crash, missing language data)."""


@dataclass(frozen=True)
class OcrEngine:
    """How to run Tesseract, and what this machine has of it."""

    mode: str = "on"  # on: pages without a usable text layer; force: every page; off: none
    command: str = "tesseract"
    tessdata: str | None = None  # TESSDATA_PREFIX for the subprocess; None: Tesseract's own default
    languages: str = DEFAULT_LANGUAGES  # the multi-language run when a page's language is unknown
    dpi: int = declared_default("ocr_dpi")
    timeout_s: float = declared_default("ocr_timeout_s")
    workers: int = 0  # Tesseract processes at once on a document's pages; 0: one per usable CPU
    available: bool = False  # set by probe(): the command runs and knows at least one language
    installed: tuple[str, ...] = field(default=())  # traineddata names found by probe()
    problem: str = ""  # why it is not available, one line

    @classmethod
    def probe(cls, mode: str = "on", command: str = "tesseract", tessdata: str | None = None,
              languages: str = DEFAULT_LANGUAGES, dpi: int = declared_default("ocr_dpi"),
              timeout_s: float = declared_default("ocr_timeout_s"),
              workers: int = 0) -> "OcrEngine":
        """The engine with what ``tesseract --list-langs`` says is installed (not run when mode is off)."""
        base = cls(mode=mode, command=command, tessdata=tessdata, languages=languages, dpi=dpi, timeout_s=timeout_s,
                   workers=workers)
        if mode == "off":
            return base
        path = shutil.which(command)
        if path is None:
            return replace(base, problem=f"Tesseract was not found ({command!r} is not on PATH)")
        try:
            out = subprocess.run([path, "--list-langs"], capture_output=True, text=True, timeout=30,
                                 env=base.environment())
        except (OSError, subprocess.TimeoutExpired) as exc:
            return replace(base, problem=f"Tesseract does not run ({exc})")
        names = tuple(line.strip() for line in out.stdout.splitlines()[1:]
                      if line.strip() and line.strip() != "osd")
        if out.returncode != 0 or not names:
            return replace(base, problem=f"Tesseract has no language data (tessdata {tessdata or 'default'})")
        return replace(base, command=path, available=True, installed=names)

    @classmethod
    def from_settings(cls, settings) -> "OcrEngine":
        return cls.probe(mode=settings.ocr, command=settings.tesseract, tessdata=settings.tessdata,
                         languages=settings.ocr_languages, dpi=settings.ocr_dpi, timeout_s=settings.ocr_timeout_s,
                         workers=settings.ocr_workers)

    @property
    def enabled(self) -> bool:
        return self.mode != "off" and self.available

    @property
    def parallel(self) -> int:
        """Pages read by Tesseract at once: ``workers``, or one per CPU this process
        may use (asked where the pages are read: the extraction child's own CPUs)."""
        return self.workers if self.workers > 0 else usable_cpus()

    def shared_by(self, documents: int) -> "OcrEngine":
        """The engine for one of ``documents`` extractions that run at once (the API's
        EVIDENTIA_INDEX_WORKERS): with ``workers`` 0 each gets its share of the CPUs,
        at least one, instead of one Tesseract per CPU each (documents x CPUs
        processes, each with its own memory limit). An explicit ``workers`` stands."""
        if self.workers > 0 or documents <= 1:
            return self
        return replace(self, workers=max(1, usable_cpus() // documents))

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # Tesseract's OpenMP threads fight the indexer (and each other) for the
        # cores; one thread per page is faster on small machines.
        env["OMP_THREAD_LIMIT"] = "1"
        if self.tessdata:
            env["TESSDATA_PREFIX"] = self.tessdata
        return env

    def language_problems(self) -> tuple[str, str]:
        """What ``languages`` asks that cannot be read, as (error, warning), "" where
        nothing: entries that are no Tesseract language at all (an error: the setting is
        wrong), and languages whose pack is not installed (a warning with the package
        to install; the others are read). Nothing with OCR off: the setting is not used."""
        if self.mode == "off":
            return "", ""
        names = self.languages.split("+")
        unknown = [n for n in names if n not in self.installed and n not in TESSERACT_MODELS]
        if unknown:
            # Tesseract's name of each, where it has one: fr -> fra, ENG -> eng
            named = {n: TESSERACT_LANGUAGES.get(n.lower()) or (n.lower() if n.lower() in TESSERACT_MODELS else "")
                     for n in unknown}
            fixed = "+".join(dict.fromkeys(named.get(n, n) for n in names))
            hint = f" (did you mean {fixed}?)" if all(named.values()) else ""
            here = f"; installed here: {', '.join(sorted(self.installed))}" if self.available else ""
            verb = "is not a Tesseract language" if len(unknown) == 1 else "are not Tesseract languages"
            return (f"EVIDENTIA_OCR_LANGUAGES must be Tesseract language names joined by +, not {self.languages!r}: "
                    f"{', '.join(unknown)} {verb}{hint}{here}"), ""
        missing = [n for n in names if n not in self.installed]
        # a missing Tesseract is said on its own; the default's missing packs are not said on
        # every run of a machine with English alone (the README's install line lists them)
        if not missing or not self.available or self.languages == DEFAULT_LANGUAGES:
            return "", ""
        verb = "is" if len(missing) == 1 else "are"
        packages = " ".join(f"tesseract-ocr-{n.replace('_', '-')}" for n in missing)
        used = self.languages_for(None)
        return "", (f"EVIDENTIA_OCR_LANGUAGES: {', '.join(missing)} {verb} not installed, so pages of unknown "
                    f"language are read with {used}: apt-get install {packages} (EVIDENTIA_OCR_LANGUAGES={used} "
                    "silences this)")

    def languages_for(self, language: str | None) -> str:
        """Tesseract's -l argument: the page's language where known and installed,
        else the multi-language run (limited to what is installed)."""
        name = TESSERACT_LANGUAGES.get(language or "")
        if name and name in self.installed:
            return name
        wanted = [n for n in self.languages.split("+") if n in self.installed]
        return "+".join(wanted) or ("eng" if "eng" in self.installed else self.installed[0])


@dataclass(frozen=True)
class OcrBacklog:
    """How much of a document OCR still has to look at: reported once its text layers
    are read and every page is decided (before the first page goes to Tesseract), and
    after each such page, so that a scan of 300 pages shows how far it is, not only how
    many pages are done. A document whose pages all do without OCR reports none."""

    pages: int  # in the document
    left: int  # pages going to Tesseract not yet read (never a blank page, nor a short text layer alone)


@dataclass(frozen=True)
class PageText:
    """How a page's text was obtained."""

    text: str
    source: str  # one of SOURCES
    confidence: float | None = None  # mean Tesseract word confidence (0-100), OCR only
    seconds: float = 0.0  # time spent on OCR
    languages: str = ""  # the Tesseract languages used
    problem: str = ""  # why an unread page was not read


# -- is the text layer usable? --------------------------------------------------

# Code points no real text holds: the replacement character, private-use glyph
# codes (fonts without a Unicode map), C0/C1 controls other than whitespace.
_JUNK = re.compile("[\ufffd\ue000-\uf8ff\U000f0000-\U0010ffff\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_LETTER = re.compile(r"[^\W\d_]")
# Words of 2+ Latin letters; of those, words of consonants only; and case
# switches inside words ("tHqZ"). Counted by the regex engine: a Python loop over
# a page's words would cost about as much as extracting the page.
_LATIN_WORD = re.compile(r"\b[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f]{2,}\b")
_CONSONANT_WORD = re.compile(r"\b[b-df-hj-np-tv-xzB-DF-HJ-NP-TV-XZ\u00c7\u00d1\u00df\u00e7\u00f1]{2,}\b")
_CASE_SWITCH = re.compile(r"[a-z][A-Z]")
# the checks look at the start of the page only: junk is uniform
GARBAGE_SAMPLE_CHARS = 2000


def junk_share(text: str) -> float:
    """Share of the visible characters that no real text contains."""
    visible = sum(map(len, text.split()))
    return len(_JUNK.findall(text)) / visible if visible else 0.0


def is_garbage(text: str) -> bool:
    """A text layer that holds no real words: glyph codes of a font without a
    Unicode map, or letter soup. Conservative on purpose, since a garbage page
    loses its text layer: text in any script passes, and so do tables of figures.

    - more than a quarter of the visible characters are junk code points, or
    - among at least 20 Latin-script words of 2+ letters, over 40% have no vowel
      (real text in any Latin-script language: under 10%, mostly abbreviations),
      or there are more case switches inside words ("tHqZ") than half the words
      (real text: "iPhone", "McDonald", a few in a hundred words).
    """
    sample = text[:GARBAGE_SAMPLE_CHARS]
    if junk_share(sample) > 0.25:
        return True
    words = len(_LATIN_WORD.findall(sample))
    if words < 20:
        return False
    return (len(_CONSONANT_WORD.findall(sample)) > 0.4 * words
            or len(_CASE_SWITCH.findall(sample)) > 0.5 * words)


def letters(text: str) -> int:
    return len(_LETTER.findall(text))


def has_letters(text: str, n: int) -> bool:
    """At least ``n`` letters (stops counting there: cheap on long pages)."""
    return sum(1 for _ in islice(_LETTER.finditer(text), n)) >= n


def drawings(page: pymupdf.Page) -> tuple[float, int]:
    """The share of the page's area that its images cover, and how many paths it
    draws: one pass over the page's drawing log."""
    area = abs(page.rect) or 1.0
    image_area = 0.0
    paths = 0
    for kind, bbox in page.get_bboxlog():
        if kind == "fill-image" or kind == "fill-imgmask":
            image_area += abs(pymupdf.Rect(bbox) & page.rect)
        elif kind in ("fill-path", "stroke-path"):
            paths += 1
    return image_area / area, paths


def image_cover(page: pymupdf.Page) -> float:
    """The share of the page's area that its images cover."""
    return drawings(page)[0]


def looks_scanned(drawn: tuple[float, int]) -> bool:
    """A page (with almost no text) whose ``drawings`` show an image over much of its
    area, or many drawn paths (glyphs turned into outlines)."""
    cover, paths = drawn
    return cover >= SCAN_IMAGE_COVER or paths >= OUTLINED_TEXT_PATHS


def shows_anything(page: pymupdf.Page) -> bool:
    """Whether anything at all is drawn on the page (a blank page needs no OCR)."""
    return any(kind != "ignore-text" for kind, _ in page.get_bboxlog())


def ocr_reason(page: pymupdf.Page, text_layer: str,
               drawn: Callable[[], tuple[float, int]] | None = None) -> str | None:
    """Why the page needs Tesseract: ``junk`` (a text layer of glyph junk), ``scan``
    (too little text on a page that looks scanned, or nothing but drawings),
    ``figure`` (a caption under a figure printed as an image); None: it does not.
    ``drawn`` gives the page's ``drawings``, for a caller that needs them again."""
    if is_garbage(text_layer):
        return "junk"
    if has_letters(text_layer, FIGURE_CAPTION_LETTERS):
        return None
    drawn = drawn or (lambda: drawings(page))
    if has_letters(text_layer, SHORT_TEXT_LETTERS):
        return "figure" if drawn()[0] >= SCAN_IMAGE_COVER else None
    scanned = looks_scanned(drawn()) if text_layer.strip() else shows_anything(page)
    return "scan" if scanned else None


def needs_ocr(page: pymupdf.Page, text_layer: str, drawn: Callable[[], tuple[float, int]] | None = None) -> bool:
    """No usable text layer: junk, or too little text on a page that looks scanned,
    or a caption under a figure printed as an image."""
    return ocr_reason(page, text_layer, drawn) is not None


def ocr_replaces(ocr_text: str, text_layer: str) -> bool:
    """Whether Tesseract's reading of a page improves on its text layer: more
    letters than a stamp or a page number; FIGURE_GAIN times those of a caption."""
    layer = letters(text_layer)
    needed = layer if layer < SHORT_TEXT_LETTERS else FIGURE_GAIN * layer
    return letters(ocr_text) > needed


# -- reading a page -------------------------------------------------------------


def read_page(page: pymupdf.Page, engine: OcrEngine, language: str | None = None,
              text_layer: str | None = None) -> PageText:
    """The page's text and how it was obtained. ``language`` (ISO 639-1, e.g. the
    document's majority language) picks the Tesseract language; None runs the
    multi-language set. ``text_layer`` saves extracting it again."""
    prepared = prepare_page(page, engine, text_layer)
    if isinstance(prepared, PageText):
        return prepared
    with TesseractPool(engine, 1) as pool:
        return read_rendered(prepared, engine, pool, pool.submit(prepared.image, engine.languages_for(language)))


@dataclass(frozen=True)
class Rendered:
    """A page that needs Tesseract, rendered for it (``prepare_page``)."""

    image: bytes  # the page as a grey PNG (``render``)
    kept: str  # its text layer, kept where OCR does not improve on it ("" for glyph junk)
    seconds: float = 0.0  # the render's time, counted in the page's OCR time

    @property
    def fallback(self) -> str:
        """The page's source when it is not read."""
        return TEXT if self.kept.strip() else UNREAD


def prepare_page(page: pymupdf.Page, engine: OcrEngine, text_layer: str | None = None) -> PageText | Rendered:
    """``read_page`` up to Tesseract: the page's ``PageText`` where no OCR is needed
    (or none can run), else its render. PyMuPDF work only: the caller's thread."""
    decided = decide_page(page, engine, text_layer)
    return decided if isinstance(decided, PageText) else render_page(page, engine, decided)


@dataclass(frozen=True)
class ToRead:
    """A page that goes to Tesseract (``decide_page``), not rendered yet."""

    kept: str  # its text layer, kept where OCR does not improve on it ("" for glyph junk)


def decide_page(page: pymupdf.Page, engine: OcrEngine, text_layer: str | None = None) -> PageText | ToRead:
    """``prepare_page`` without the render: the page's ``PageText`` where no OCR is
    needed (or none can run), else ``ToRead``. Apart from the render so that a
    document knows how many of its pages Tesseract will read before it reads any."""
    if text_layer is None:
        text_layer = page.get_text("text", sort=False)
    # the drawing log read once: on a page of 350,000 strokes a reading takes seconds
    drawn = functools.cache(lambda: drawings(page))
    if engine.mode != "force" and not needs_ocr(page, text_layer, drawn):
        return PageText(text_layer, TEXT if text_layer.strip() else NONE)
    if engine.mode == "force" and not shows_anything(page):
        return PageText("", NONE)
    garbage = is_garbage(text_layer)
    kept = "" if garbage else text_layer  # a junk layer is never shown or searched
    fallback = TEXT if kept.strip() else UNREAD
    if engine.mode == "off":
        return PageText(kept, fallback, problem="OCR is off: EVIDENTIA_OCR=off")
    if not engine.available:
        return PageText(kept, fallback, problem=engine.problem)
    paths = drawn()[1]
    if paths > MAX_OCR_PATHS:
        return PageText(kept, fallback, problem=f"the page draws {paths} paths, too many to render for OCR "
                                                 f"(at most {MAX_OCR_PATHS})")
    return ToRead(kept)


def render_page(page: pymupdf.Page, engine: OcrEngine, decided: ToRead) -> Rendered:
    """The render of a page ``decide_page`` sent to Tesseract."""
    t0 = time.perf_counter()
    image = render(page, engine.dpi)
    return Rendered(image, decided.kept, time.perf_counter() - t0)


def read_rendered(page: Rendered, engine: OcrEngine, pool: "TesseractPool", run: "TesseractRun") -> PageText:
    """``read_page`` after the render: the page's text from ``run`` (Tesseract on
    ``page.image``, submitted to ``pool``), waiting for it."""
    try:
        text, confidence, seconds = pool.result(run)
    except OcrError as exc:
        return PageText(page.kept, page.fallback, languages=run.languages, problem=str(exc))
    seconds += page.seconds
    # a short text layer (a stamp, a page number, a photo's caption) that OCR did
    # not improve on stays; a page where OCR found no letters had nothing to read
    if engine.mode != "force" and not ocr_replaces(text, page.kept):
        return PageText(page.kept, TEXT if page.kept.strip() else NONE, seconds=seconds, languages=run.languages)
    return PageText(text, OCR, confidence=confidence, seconds=seconds, languages=run.languages)


def render(page: pymupdf.Page, dpi: int) -> bytes:
    """The page as a grey PNG at ``dpi`` (less for huge pages), with its resolution set."""
    rect = page.rect
    pixels = (rect.width * dpi / 72) * (rect.height * dpi / 72)
    if pixels > MAX_PIXELS:
        # no floor: a page of PDF's largest size (200 inches a side) is 207 megapixels even
        # at 72 dpi, past the extraction's memory limit, and failed its whole document;
        # text printed that large still reads at the 31 dpi that fit
        dpi = max(1, int(dpi * (MAX_PIXELS / pixels) ** 0.5))
    pix = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY, alpha=False)
    pix.set_dpi(dpi, dpi)
    return pix.tobytes("png")


def ocr_page(page: pymupdf.Page, engine: OcrEngine, languages: str) -> tuple[str, float | None, float]:
    """(text, mean word confidence or None without words, seconds) from Tesseract."""
    t0 = time.perf_counter()
    image = render(page, engine.dpi)
    with TesseractPool(engine, 1) as pool:
        text, confidence, _ = pool.result(pool.submit(image, languages))
    return text, confidence, time.perf_counter() - t0


# -- Tesseract processes ----------------------------------------------------------


class TesseractRun:
    """One reading of a rendered page by Tesseract: queued, running, then done."""

    def __init__(self, image: bytes, languages: str) -> None:
        self.image: bytes | None = image  # dropped once Tesseract has it
        self.languages = languages
        self.process: subprocess.Popen | None = None
        self.output: tuple[IO[bytes], IO[bytes]] | None = None  # stdout, stderr (files: nothing blocks on a pipe)
        self.started = 0.0
        self.outcome: tuple[str, float | None, float] | OcrError | None = None  # None: not done


class TesseractPool:
    """Runs up to ``workers`` Tesseract processes at once, in submission order,
    driven by the calling thread: ``submit`` starts one where a slot is free,
    ``result`` waits for one (starting queued ones as others end), and leaving
    the ``with`` block kills whatever still runs, so no process outlives it.

    Why not threads, each waiting on its subprocess: in the extraction child
    (indexer/worker.py) the address space is capped, and each thread costs ~72 MB
    of it (a malloc arena and a stack): 8 of them took 576 MB of the default
    768 MB, and MuPDF's allocations failed. A process costs the caller nothing.
    The image goes to Tesseract through a temporary file, and its TSV comes back
    through one: a process is never blocked on a pipe nobody reads yet."""

    def __init__(self, engine: OcrEngine, workers: int = 1) -> None:
        self.engine = engine
        self.workers = max(1, workers)
        self._queued: deque[TesseractRun] = deque()
        self._running: list[TesseractRun] = []

    def __enter__(self) -> "TesseractPool":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def submit(self, image: bytes, languages: str, first: bool = False) -> TesseractRun:
        """Reads ``image`` (a ``render``) with ``-l languages``, now or when a slot
        frees; ``first``: before the runs already queued (one the caller waits for)."""
        run = TesseractRun(image, languages)
        if first:
            self._queued.appendleft(run)
        else:
            self._queued.append(run)
        self._collect()
        self._start_queued()
        return run

    def result(self, run: TesseractRun) -> tuple[str, float | None, float]:
        """(text, mean word confidence, seconds) of ``run`` once it ends; ``OcrError``
        when Tesseract failed, timed out or was cancelled."""
        while run.outcome is None:
            self._wait(run)
            self._collect()
            self._start_queued()
        if isinstance(run.outcome, OcrError):
            raise run.outcome
        return run.outcome

    def cancel(self, run: TesseractRun) -> None:
        """Drops ``run``: unstarted, it never starts; running, it is killed."""
        if run.outcome is not None:
            return
        if run in self._queued:
            self._queued.remove(run)
        else:
            self._stop(run)
        run.image = None
        run.outcome = OcrError("cancelled")

    def close(self) -> None:
        for run in [*self._queued, *self._running]:
            self.cancel(run)

    def _wait(self, run: TesseractRun) -> None:
        """Until ``run`` ends or runs out of time where nothing else runs or waits;
        else at most POLL_S, to start queued runs as soon as others end."""
        if run.process is None:  # queued behind the running ones
            time.sleep(POLL_S)
            return
        alone = len(self._running) == 1 and not self._queued
        try:
            run.process.wait(timeout=max(0.0, run.started + self.engine.timeout_s - time.perf_counter())
                             if alone else POLL_S)
        except subprocess.TimeoutExpired:
            pass

    def _start_queued(self) -> None:
        while self._queued and len(self._running) < self.workers:
            run = self._queued.popleft()
            self._start(run)
            if run.outcome is None:
                self._running.append(run)

    def _start(self, run: TesseractRun) -> None:
        engine = self.engine
        try:
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            with tempfile.TemporaryFile() as image:
                image.write(run.image or b"")
                image.seek(0)
                run.process = subprocess.Popen(
                    [engine.command, "stdin", "stdout", "-l", run.languages, "--dpi", str(engine.dpi), "--psm", "3",
                     "tsv"], stdin=image, stdout=out, stderr=err, env=engine.environment())
        except OSError as exc:  # no such command, or no room for its files (those made are closed when freed)
            run.outcome = OcrError(f"Tesseract does not run ({exc})")
            return
        finally:
            run.image = None
        run.started = time.perf_counter()
        run.output = (out, err)

    def _collect(self) -> None:
        """Notes the outcome of every process that ended or ran past the time limit."""
        for run in list(self._running):
            assert run.process is not None and run.output is not None
            seconds = time.perf_counter() - run.started
            code = run.process.poll()
            if code is None and seconds <= self.engine.timeout_s:
                continue
            if code is None:
                self._stop(run)
                run.outcome = OcrError(f"OCR took over {self.engine.timeout_s:g} s (EVIDENTIA_OCR_TIMEOUT_S)")
                continue
            out, err = (self._drain(f) for f in run.output)
            self._running.remove(run)
            run.output = None
            if code != 0:
                text = err.decode("utf-8", "replace")
                lines = [ln for ln in text.splitlines() if ln.strip()]
                if any(word in text for word in OUT_OF_MEMORY_WORDS):
                    # C++'s "what(): std::bad_alloc" is no reason a person can act on
                    run.outcome = OcrError("Tesseract ran out of memory on the page (an extraction may add "
                                           "EVIDENTIA_EXTRACT_MEMORY_MB; a lower EVIDENTIA_OCR_DPI needs less)")
                else:
                    run.outcome = OcrError(f"Tesseract failed ({lines[-1] if lines else f'exit code {code}'})")
            else:
                run.outcome = (*parse_tsv(out.decode("utf-8", "replace")), seconds)

    def _stop(self, run: TesseractRun) -> None:
        """Kills a running process and waits for it (no zombie, no process left)."""
        if run in self._running:
            self._running.remove(run)
        if run.process is not None and run.process.poll() is None:
            run.process.kill()
            run.process.wait()
        for f in run.output or ():
            f.close()
        run.output = None

    @staticmethod
    def _drain(f: IO[bytes]) -> bytes:
        f.seek(0)
        data = f.read()
        f.close()
        return data


def parse_tsv(tsv: str) -> tuple[str, float | None]:
    """Tesseract TSV -> text (words of a line joined by spaces, paragraphs by a
    blank line) and the mean confidence of its words."""
    paragraphs: dict[tuple[str, ...], dict[tuple[str, ...], list[str]]] = {}
    confidences: list[float] = []
    for row in tsv.splitlines()[1:]:
        cols = row.split("\t")
        if len(cols) != 12 or cols[0] != "5" or not cols[11].strip():
            continue
        try:
            conf = float(cols[10])
        except ValueError:
            continue
        if conf >= 0:
            confidences.append(conf)
        para = tuple(cols[1:4])  # page, block, paragraph
        paragraphs.setdefault(para, {}).setdefault(tuple(cols[1:5]), []).append(cols[11].strip())
    text = "\n\n".join("\n".join(" ".join(words) for words in lines.values()) for lines in paragraphs.values())
    mean = round(sum(confidences) / len(confidences), 1) if confidences else None
    return text, mean
