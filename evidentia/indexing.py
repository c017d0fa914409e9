"""Index files and folders of PDFs into a search backend, one document at a time."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from evidentia.language import LanguageDetector
from evidentia.indexer.ocr import INSTALL_HINT, MISSING_PROBLEMS, OcrBacklog, OcrEngine, PageText
from evidentia.indexer.pdf import PdfError, extract_pages
from evidentia.indexer.worker import ExtractionLimits, extract_bounded
from evidentia.records import Document
from evidentia.retriever.base import SearchBackend
from evidentia.store import closest_document_id, document_id_for
from evidentia.tenants import split_internal_id
from evidentia.text import listed

if TYPE_CHECKING:  # pragma: no cover
    from evidentia.retriever.dense import PageEmbedder


@dataclass
class IndexFailure:
    path: str
    reason: str


@dataclass
class IndexSummary:
    documents: int = 0
    pages: int = 0
    empty_pages: int = 0
    failures: list[IndexFailure] = field(default_factory=list)
    doc_ids: list[str] = field(default_factory=list)
    sources: dict[str, Path] = field(default_factory=dict)  # doc id -> the file it was indexed from
    embedded_pages: int = 0  # pages run through the embedding model (0 with EVIDENTIA_DENSE=off)
    embed_seconds: float = 0.0  # time spent embedding, included in seconds
    seconds: float = 0.0  # the whole run: extraction, OCR, embedding, writing
    ocr_pages: int = 0  # pages whose text was read by OCR
    ocr_seconds: float = 0.0  # time spent in OCR, included in seconds
    unread_pages: int = 0  # pages that show something but were not read (OCR off, no Tesseract, OCR failed)
    unread_reason: str = ""  # why, one line (the first reason met)
    caption_only_pages: int = 0  # scans or figures that kept only a short text layer (OCR could not run)
    ocr: dict[str, dict] = field(default_factory=dict)  # doc id -> how its pages were read (ocr_stats)

    def line(self) -> str:
        return (f"{self.documents} document(s), {self.pages} page(s) indexed, "
                f"{self.empty_pages} empty page(s) (no extractable text), {len(self.failures)} failure(s)")

    def ocr_line(self) -> str | None:
        """What OCR did and cost, and the pages it could not read; None when no page needed it."""
        parts = []
        if self.ocr_pages:
            rate = self.ocr_pages / self.ocr_seconds if self.ocr_seconds > 0 else 0.0
            parts.append(f"OCR: {self.ocr_pages} page(s) read in {self.ocr_seconds:.1f} s ({rate:.2f} pages/s)")
        if self.unread_pages:
            parts.append(f"{self.unread_pages} page(s) not read: {self.unread_reason or 'no usable text layer'}")
        if self.caption_only_pages:
            reason = "" if self.unread_pages else f": {self.unread_reason}"
            parts.append(f"{self.caption_only_pages} page(s) showing a scan or a figure kept only their short "
                         f"text layer (a caption, a stamp){reason}")
        return "; ".join(parts) or None

    def add_document(self, document: Document) -> None:
        """Count an indexed document."""
        self.documents += 1
        self.pages += document.page_count
        self.empty_pages += document.empty_pages
        self.ocr_pages += document.ocr_pages
        self.ocr_seconds += document.ocr_seconds
        self.unread_pages += document.unread_pages
        self.caption_only_pages += document.caption_only_pages
        if (document.unread_pages or document.caption_only_pages) and not self.unread_reason:
            self.unread_reason = unread_reason(document.ocr_problem)
        self.doc_ids.append(document.doc_id)
        self.ocr[document.doc_id] = ocr_stats(document)

    def embedding_line(self) -> str | None:
        """What the embeddings cost, or None when none were computed."""
        if not self.embedded_pages:
            return None
        rate = self.embedded_pages / self.embed_seconds if self.embed_seconds > 0 else 0.0
        share = f", {100 * self.embed_seconds / self.seconds:.0f}% of indexing time" if self.seconds > 0 else ""
        return (f"embeddings: {self.embedded_pages} page(s) in {self.embed_seconds:.1f} s "
                f"({rate:.1f} pages/s{share}); EVIDENTIA_DENSE=off skips them")


def ocr_stats(document: Document) -> dict:
    """What a document's store row keeps of how its pages were read (see indexer/ocr.py):
    the same for an upload and for a document the CLI indexed."""
    stats: dict = {"ocr_pages": document.ocr_pages, "unread_pages": document.unread_pages,
                   "caption_only_pages": document.caption_only_pages,
                   "ocr_confidence": document.ocr_confidence, "ocr_seconds": round(document.ocr_seconds, 2)}
    if document.unread_pages or document.caption_only_pages:
        stats["unread_reason"] = unread_reason(document.ocr_problem)
    return stats


def unread_reason(problem: str) -> str:
    """The reason pages were left unread, with how to fix it where Tesseract is missing."""
    if problem.startswith(MISSING_PROBLEMS):
        return f"they look scanned or printed as images and {problem}; {INSTALL_HINT}"
    return problem


def find_pdfs(paths: Iterable[Path]) -> tuple[list[Path], list[IndexFailure]]:
    """Expand folders (recursively, *.pdf in any case); report paths that do not exist.
    A file named explicitly is taken whatever its extension, so a mislabelled
    upload still gets a clear 'not a PDF' error."""
    files: list[Path] = []
    missing: list[IndexFailure] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() == ".pdf"))
        elif path.is_file():
            files.append(path)
        else:
            missing.append(IndexFailure(str(path), f"{path}: no such file or folder"))
    return list(dict.fromkeys(files)), missing


def pdfs_by_document_id(folders: Iterable[Path]) -> dict[str, Path]:
    """The PDFs under ``folders`` (recursively; files too) by the document id `evidentia
    index` and uploads give each (``store.document_id_for``): labelled queries name a
    document so, whatever its file name. Where two files share an id, the first found."""
    files, _ = find_pdfs(folders)
    found: dict[str, Path] = {}
    for path in files:
        found.setdefault(document_id_for(path.name), path)
    return found


def likely_pdf(doc_id: str, pdfs: dict[str, Path]) -> tuple[str, Path, bool] | None:
    """(id, file, whether surely that file) of the PDF a labelled query most likely means
    by ``doc_id``, an id no file of ``pdfs`` (``pdfs_by_document_id``) has: surely the
    file whose stem it is, or whose id it gives once made an id (accents, spaces);
    else the closest id in any case (a typo); None when none is close."""
    as_id = document_id_for(f"{doc_id}.pdf")  # the suffix keeps a dot in the id ("report.v2")
    for key, path in pdfs.items():
        # or its id before a name that lost letters got its hash ("2023" is now "2023-9293ec27")
        if path.stem == doc_id or key == as_id or re.fullmatch(re.escape(doc_id) + "-[0-9a-f]{8}", key):
            return key, path, True
    close = closest_document_id(doc_id, pdfs)
    return (close, pdfs[close], False) if close is not None else None


def missing_pdfs_hint(missing: Sequence[str], folders: Sequence[Path], limit: int = 3) -> str:
    """``"; …"`` naming, for each missing id, the file of ``folders`` it likely means and
    that file's id; "" when no file is close: a query naming a PDF by its file name
    rather than its id (accents, spaces) was refused with nothing said of the file."""
    pdfs = pdfs_by_document_id(folders)
    hints = []
    for doc_id in missing:
        found = likely_pdf(doc_id, pdfs)
        if found is None or found[0] == doc_id:  # none close, or the file of that id failed (said above)
            continue
        key, path, sure = found
        hints.append(f"{doc_id} is {path}, whose id is {key}" if sure
                     else f"the file closest to {doc_id} is {path}, id {key}")
    if not hints:
        return ""
    return ("; a query names a PDF by its document id, the file name as `evidentia index` makes it: "
            + listed(hints, limit, "; "))


def embed_document(document: Document, embedder: "PageEmbedder | None",
                   on_embedded: Callable[[int], None] | None = None) -> Document:
    """The document with its page vectors (unchanged without an embedder)."""
    if embedder is None:
        return document
    return replace(document, vectors=embedder.embed_pages(document.pages, on_progress=on_embedded))


def index_pdf(path: Path, backend: SearchBackend, detector: LanguageDetector, doc_id: str | None = None,
              embedder: "PageEmbedder | None" = None, ocr: OcrEngine | None = None):
    """Extract (and embed), then write in one step: a PDF that fails leaves nothing behind."""
    document = extract_pages(Path(path), doc_id or Path(path).stem, detector, ocr=ocr)
    document = embed_document(document, embedder)
    backend.index_document(document)
    return document


def index_paths(
    paths: Sequence[Path],
    backend: SearchBackend,
    detector: LanguageDetector,
    on_document: Callable[[Path, int], None] | None = None,
    embedder: "PageEmbedder | None" = None,
    on_embedded: Callable[[int], None] | None = None,
    ocr: OcrEngine | None = None,
    on_ocr_page: Callable[[PageText], None] | None = None,
    doc_id_of: Callable[[Path], str] = lambda path: path.stem,
    limits: "ExtractionLimits | None" = None,
    on_ocr_backlog: Callable[[OcrBacklog], None] | None = None,
) -> IndexSummary:
    """Index every PDF under ``paths``; bad files are recorded, the rest still indexed.
    ``on_document(path, pages)`` is called after each file (pages = 0 on failure).
    With an ``embedder``, each document's pages are embedded (in batches) before
    it is written, and ``on_embedded(pages)`` reports pages as they are done.
    ``ocr`` reads pages without a usable text layer (None: they stay unread and
    counted); ``on_ocr_page`` reports each page OCR'd, ``on_ocr_backlog`` how many
    pages of the document being read OCR has still to look at.
    With ``limits``, each file is extracted in a bounded child process
    (indexer/worker.py): a hostile file fails with its reason instead of
    exhausting this process's memory or time."""
    t_start = time.perf_counter()
    files, failures = find_pdfs(paths)
    summary = IndexSummary(failures=failures)
    # Two files of one run with the same stem would silently replace each other.
    indexed_from: dict[str, Path] = {}

    def extract(path: Path, doc_id: str) -> Document:
        last: list[OcrBacklog] = []  # the document's latest backlog

        def backlog(report: OcrBacklog) -> None:
            last[:] = [report]
            on_ocr_backlog(report)

        reported = backlog if on_ocr_backlog is not None else None
        try:
            if limits is None:
                return extract_pages(Path(path), doc_id, detector, ocr=ocr, on_ocr_page=on_ocr_page,
                                     on_ocr_backlog=reported)
            # the same extraction, OCR included, in a bounded child process
            return extract_bounded(Path(path), doc_id, detector.probe_chars, limits, {"ocr": ocr},
                                   on_ocr_page=on_ocr_page, on_ocr_backlog=reported)
        finally:
            # a document that failed while OCR read it (a cap, a time limit) has nothing
            # left to read: its count must not stay on the progress of the next ones
            if last and last[0].left:
                on_ocr_backlog(OcrBacklog(last[0].pages, 0))


    def extracted():
        # Bad files are recorded and skipped here, so the backend only ever
        # receives whole documents and the rest of the batch goes on.
        # The next file is extracted while this one is embedded (one ahead, in a
        # thread: the embedding model and a bounded extraction child release the
        # GIL), so extraction costs no wall time when embedding is the slow part.
        ids = [doc_id_of(path) for path in files]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="evidentia-extract") as pool:
            ahead = pool.submit(extract, files[0], ids[0]) if files else None
            for n, (path, doc_id) in enumerate(zip(files, ids)):
                job = ahead
                if n + 1 < len(files):
                    ahead = pool.submit(extract, files[n + 1], ids[n + 1])
                pages = 0
                if doc_id in indexed_from:
                    job.cancel()
                    summary.failures.append(IndexFailure(str(path), (
                        f"{path}: document id {split_internal_id(doc_id)[1]!r} already indexed from "
                        f"{indexed_from[doc_id]} in this run (rename one of the files)")))
                else:
                    try:
                        document = job.result()
                    except PdfError as exc:
                        # the file as it was given (a folder's sub/empty.pdf and empty.pdf read alike by name)
                        reason = str(exc)
                        if reason.startswith(f"{path.name}: "):
                            reason = f"{path}{reason[len(path.name):]}"
                        summary.failures.append(IndexFailure(str(path), reason))
                    else:
                        if embedder is not None:
                            t0 = time.perf_counter()
                            document = embed_document(document, embedder, on_embedded)
                            summary.embed_seconds += time.perf_counter() - t0
                            summary.embedded_pages += document.page_count
                        summary.add_document(document)
                        summary.sources[document.doc_id] = Path(path)
                        indexed_from[document.doc_id] = path
                        pages = document.page_count
                        yield document
                if on_document:
                    on_document(path, pages)

    try:
        backend.index_documents(extracted())
    finally:
        summary.seconds = time.perf_counter() - t_start
    return summary


def index_paths_with_progress(paths: Sequence[Path], backend: SearchBackend, detector: LanguageDetector,
                              embedder: "PageEmbedder | None" = None, show: bool = True,
                              doc_id_of: Callable[[Path], str] = lambda path: path.stem,
                              every_s: float = 10.0, ocr: OcrEngine | None = None,
                              limits: "ExtractionLimits | None" = None) -> IndexSummary:
    """``index_paths`` with its progress on stderr (a bar on a terminal, a line every
    ``every_s`` seconds otherwise): documents, pages indexed, pages OCR'd and pages
    embedded (OCR and embedding are the slow parts on a CPU)."""
    from evidentia.progress import Progress

    files, _ = find_pdfs(paths)
    # nothing to index (a path that does not exist): the summary's error says so, with no "0/0" line
    with Progress(len(files), "indexing", "documents", show=show and bool(files), every_s=every_s) as bar:
        pages_done = embedded = ocr_done = 0
        ocr_seconds = 0.0

        # pages are OCR'd several at a time (EVIDENTIA_OCR_WORKERS): a page's own time, and how many run at once
        at_once = f", {ocr.parallel} at a time" if ocr is not None and ocr.enabled and ocr.parallel > 1 else ""

        ocr_left = 0  # of the document being read: a long scan shows how far OCR has gone

        def refresh() -> None:
            ocr_part = f", {ocr_done} OCR'd ({ocr_seconds / ocr_done:.1f} s each{at_once})" if ocr_done else ""
            if ocr_left:
                ocr_part += f", {ocr_left} more to read by OCR" if ocr_done else f", {ocr_left} to read by OCR"
            # pages of the documents written to the index; the one being read is OCR'd
            # and embedded first, so "embedded" runs ahead of "written"
            bar.note(f"{pages_done} pages written{ocr_part}" + (f", {embedded} embedded" if embedder else ""))

        def on_ocr_backlog(backlog: OcrBacklog) -> None:
            nonlocal ocr_left
            ocr_left = backlog.left
            refresh()

        def on_ocr_page(read: PageText) -> None:  # shown with the backlog that follows it
            nonlocal ocr_done, ocr_seconds
            ocr_done += 1
            ocr_seconds += read.seconds

        def on_document(path: Path, pages: int) -> None:
            nonlocal pages_done
            pages_done += pages
            bar.update(1)
            refresh()

        def on_embedded(pages: int) -> None:
            nonlocal embedded
            embedded += pages
            refresh()

        return index_paths(paths, backend, detector, on_document=on_document, embedder=embedder,
                           on_embedded=on_embedded, ocr=ocr, on_ocr_page=on_ocr_page, doc_id_of=doc_id_of,
                           limits=limits, on_ocr_backlog=on_ocr_backlog)
