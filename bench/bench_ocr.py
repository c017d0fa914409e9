"""OCR of scanned filings: does the evidence on a scanned page stay findable?

For a stated subset of financebench-dev (by default every query of the filings
that have at least 3 queries: 36 queries, 9 filings) each filing is turned into a
"scanned" twin: its evidence pages (the queries' relevant pages) plus
``--others`` randomly drawn other pages (seeded) are replaced by an image of the
page rendered at ``--dpi`` (grey, no text layer: an image-only page, as a
scanner makes it); the other pages keep their text layer. Full filings (100-260
pages) are not scanned whole: at 2-5 s of OCR per page on this machine that
would take hours; the pages whose text matters to the queries are all scanned.

Reported, per scan resolution:

- R@3 and R@20 of the BM25 first stage (query = question + answer, pages ranked
  within the query's filing, as bench/bench_bm25.py) on the original filings
  (text layer, OCR off) and on the scanned twins indexed with OCR on;
- word accuracy of the OCR text against the original text layer of the same
  pages: the share of the text layer's word tokens (as a multiset, lower-cased)
  found in the OCR text (recall), and the share of OCR tokens found in the text
  layer (precision);
- OCR pages/s (OCR time only) and extraction pages/s of the scanned filings.

A CSR sample (``--csr``, default the BHP 2020 climate report, every
``--csr-step``-th page) is scanned whole (every page an image, so no text layer
gives the OCR a language prior) to report its word accuracy and speed.

``--compare-engines N`` OCRs N scanned pages with PyMuPDF's built-in OCR
(``Page.get_textpage_ocr``) and with the Tesseract command line (what
indexer/ocr.py uses) on the same render; ``--language-cost N`` OCRs N pages
with English only, eng+fra+deu and the full multi-language set.

The ``workers`` part (not run by default) reads the same scanned document (the
first ``--workers-pages`` pages of the CSR sample's every ``--csr-step``-th,
scanned whole at the highest ``--dpi``) with each of ``--workers`` Tesseract
processes at once (EVIDENTIA_OCR_WORKERS), and reports wall-clock pages/s and
whether every run read exactly the text, sources and confidences of the first;
the exit code is 1 where one did not.

Usage: python bench/bench_ocr.py [--data ../shared/data/financebench-dev] [--dpi 150 300]
       [--min-queries 3] [--others 8] [--seed 0] [--compare-engines 4] [--language-cost 4] [--json]
       python bench/bench_ocr.py --parts workers [--workers 1 2] [--workers-pages 8] [--dpi 300]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pymupdf

from evidentia.evaluation import metrics
from evidentia.language import LanguageDetector
from evidentia.indexer.ocr import DEFAULT_LANGUAGES, OcrEngine, ocr_page
from evidentia.indexer.pdf import extract_pages
from evidentia.retriever.query import build_query
from evidentia.retriever.tantivy_backend import TantivyBackend
from evidentia.text import clean_text, tokens

POOL = 20


def scan_pages(src: Path, dst: Path, pages: set[int], dpi: int) -> None:
    """Copy ``src`` to ``dst`` with the 1-based ``pages`` replaced by grey images of
    themselves at ``dpi`` (no text layer left on them)."""
    doc = pymupdf.open(src)
    out = pymupdf.open()
    start = 0
    for index in range(doc.page_count):
        if index + 1 not in pages:
            continue
        if start < index:
            out.insert_pdf(doc, from_page=start, to_page=index - 1)
        page = doc.load_page(index)
        pix = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY, alpha=False)
        new = out.new_page(width=page.rect.width, height=page.rect.height)
        new.insert_image(new.rect, pixmap=pix)
        start = index + 1
    if start < doc.page_count:
        out.insert_pdf(doc, from_page=start, to_page=doc.page_count - 1)
    out.save(dst, garbage=1, deflate=True)
    out.close()
    doc.close()


def scan_subset(src: Path, pages: list[int], dpi: int, folder: Path, name: str) -> tuple[Path, Path]:
    """(scan, original): the 1-based ``pages`` of ``src`` copied into ``original``, and
    ``scan``, every page of it an image at ``dpi`` (no text layer gives a language prior)."""
    original = folder / f"{name}-subset.pdf"
    with pymupdf.open(src) as doc, pymupdf.open() as out:
        for p in pages:
            out.insert_pdf(doc, from_page=p - 1, to_page=p - 1)
        out.save(original)
    scan = folder / f"{name}.pdf"
    scan_pages(original, scan, set(range(1, len(pages) + 1)), dpi)
    _ORIGINALS[scan] = original
    return scan, original


def workers_speed(path: Path, engine: OcrEngine, workers: list[int], detector: LanguageDetector) -> list[dict]:
    """``path`` read with each number of Tesseract processes at once: wall-clock
    pages/s, and whether the pages came back exactly as in the first run."""
    rows: list[dict] = []
    first = None
    for count in workers:
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        document = extract_pages(path, path.stem, detector, ocr=replace(engine, workers=count))
        wall = time.perf_counter() - t0
        pages = [(p.raw_text, p.text_source, p.ocr_confidence) for p in document.pages]
        first = first or pages
        rows.append({"workers": count, "ocr_pages": document.ocr_pages, "wall_s": round(wall, 1),
                     "pages_per_s": round(document.ocr_pages / wall, 3),
                     "ocr_s_per_page": round(document.ocr_seconds / max(1, document.ocr_pages), 2),
                     "same_pages_as_first": pages == first, "load_1min": (load, os.getloadavg()[0])})
    return rows


def word_scores(reference: str, hypothesis: str) -> tuple[int, int, int]:
    """(matched tokens, reference tokens, hypothesis tokens), multisets of lower-cased tokens."""
    ref = Counter(tokens(clean_text(reference)))
    hyp = Counter(tokens(clean_text(hypothesis)))
    return sum((ref & hyp).values()), sum(ref.values()), sum(hyp.values())


def recall_scores(backend: TantivyBackend, queries: list[dict], detector: LanguageDetector) -> dict:
    r3, r20 = [], []
    per_query = {}
    for q in queries:
        keywords = build_query(q["question"], q["answer"], detector).keywords
        ranking = [(c.doc_id, c.page) for c in backend.search(keywords, [q["doc_id"]], POOL)]
        relevant = {(q["doc_id"], p) for p in q["relevant_pages"]}
        r3.append(metrics.recall_at_k(ranking, relevant, 3))
        r20.append(metrics.recall_at_k(ranking, relevant, POOL))
        per_query[q["id"]] = (r3[-1], r20[-1])
    return {"R@3": round(metrics.mean_of(r3), 3), "R@20": round(metrics.mean_of(r20), 3), "per_query": per_query}


def choose(queries: list[dict], min_queries: int, others: int, seed: int, pdf_dir: Path):
    by_doc: dict[str, list[dict]] = defaultdict(list)
    for q in queries:
        by_doc[q["doc_id"]].append(q)
    chosen = {d: qs for d, qs in by_doc.items() if len(qs) >= min_queries}
    rng = random.Random(seed)
    scanned: dict[str, set[int]] = {}
    for doc_id, qs in sorted(chosen.items()):
        relevant = {p for q in qs for p in q["relevant_pages"]}
        with pymupdf.open(pdf_dir / f"{doc_id}.pdf") as doc:
            n = doc.page_count
        pool = [p for p in range(1, n + 1) if p not in relevant]
        scanned[doc_id] = relevant | set(rng.sample(pool, min(others, len(pool))))
    return chosen, scanned


def index_docs(paths: list[Path], directory: Path, detector: LanguageDetector, engine: OcrEngine):
    """Extract (timed) and index; returns (backend, documents)."""
    backend = TantivyBackend(directory)
    documents = []
    for path in paths:
        t0 = time.perf_counter()
        document = extract_pages(path, path.stem, detector, ocr=engine)
        documents.append((document, time.perf_counter() - t0))
    backend.index_documents(d for d, _ in documents)
    return backend, documents


def compare_engines(pages: list[tuple[Path, int]], dpi: int, tessdata: str | None) -> list[dict]:
    """PyMuPDF's OCR vs the Tesseract command line on the same scanned pages."""
    engine = OcrEngine.probe(languages="eng", dpi=dpi, tessdata=tessdata)
    prefix = tessdata or os.environ.get("TESSDATA_PREFIX") or _default_tessdata()
    rows = []
    for path, page_no in pages:
        with pymupdf.open(path) as doc:
            page = doc.load_page(page_no - 1)
            original = _original_text(path, page_no)
            t0 = time.perf_counter()
            tp = page.get_textpage_ocr(language="eng", dpi=dpi, full=True, tessdata=prefix)
            mu_text = page.get_text(textpage=tp)
            mu_s = time.perf_counter() - t0
            cli_text, conf, cli_s = ocr_page(page, engine, "eng")
        m1, r1, _ = word_scores(original, mu_text)
        m2, r2, _ = word_scores(original, cli_text)
        rows.append({"page": path.stem, "pymupdf_s": round(mu_s, 2),
                     "pymupdf_acc": round(m1 / max(1, r1), 3), "cli_s": round(cli_s, 2),
                     "cli_acc": round(m2 / max(1, r2), 3), "cli_conf": conf})
    return rows


def language_cost(pages: list[tuple[Path, int, str]], dpi: int, tessdata: str | None,
                  rounds: int = 2) -> list[dict]:
    """Seconds per page and word accuracy of each -l choice, per page language.
    The choices take turns on each page, ``rounds`` times, so that a change of
    machine load hits them alike."""
    engine = OcrEngine.probe(dpi=dpi, tessdata=tessdata)
    own = {"en": "eng", "fr": "fra", "de": "deu"}
    stats: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for _ in range(rounds):
        for path, page_no, lang in pages:
            reference = _original_text(path, page_no)
            for label, langs in (("page's own", own[lang]), ("eng", "eng"), ("eng+fra+deu", "eng+fra+deu"),
                                 ("all 7", DEFAULT_LANGUAGES)):
                with pymupdf.open(path) as doc:
                    text, _, s = ocr_page(doc.load_page(page_no - 1), engine, langs)
                m, r, _ = word_scores(reference, text)
                row = stats[(lang, label)]
                row[0] += s
                row[1] += m
                row[2] += r
                row[3] += 1
    return [{"page_language": lang, "languages": label, "s_per_page": round(v[0] / v[3], 2),
             "word_acc": round(v[1] / max(1, v[2]), 3), "runs": v[3]} for (lang, label), v in stats.items()]


FOREIGN = {
    "fr": ("Politique environnementale du groupe. Notre entreprise s'engage à réduire ses émissions de gaz à effet "
           "de serre de quarante pour cent d'ici deux mille trente par rapport à l'année de référence. Chaque site "
           "de production dispose d'un système de management environnemental certifié selon la norme ISO 14001. "
           "Les fournisseurs signent notre code de conduite, qui interdit le travail des enfants et le travail "
           "forcé, et ils sont évalués tous les deux ans par un organisme indépendant. La consommation d'eau a "
           "diminué de douze pour cent grâce au recyclage des eaux de process et à la réparation des fuites. "
           "Les déchets dangereux sont collectés séparément et traités par des prestataires agréés. "),
    "de": ("Umweltpolitik der Unternehmensgruppe. Unser Unternehmen verpflichtet sich, seine Treibhausgasemissionen "
           "bis zum Jahr zweitausenddreißig gegenüber dem Basisjahr um vierzig Prozent zu senken. Jeder "
           "Produktionsstandort verfügt über ein Umweltmanagementsystem, das nach der Norm ISO 14001 zertifiziert "
           "ist. Die Lieferanten unterzeichnen unseren Verhaltenskodex, der Kinderarbeit und Zwangsarbeit "
           "verbietet, und werden alle zwei Jahre von einer unabhängigen Stelle bewertet. Der Wasserverbrauch "
           "sank um zwölf Prozent dank der Wiederverwendung von Prozesswasser und der Reparatur von Leckagen. "
           "Gefährliche Abfälle werden getrennt gesammelt und von zugelassenen Entsorgern behandelt. "),
}


def foreign_pages(folder: Path, dpi: int) -> list[tuple[Path, int, str]]:
    """One scanned A4 page per language of FOREIGN (text written by PyMuPDF, then scanned)."""
    out = []
    for lang, text in FOREIGN.items():
        original = folder / f"policy-{lang}-text.pdf"
        with pymupdf.open() as doc:
            doc.new_page(width=595, height=842).insert_textbox(pymupdf.Rect(56, 56, 540, 790), text * 2,
                                                               fontsize=11, fontname="helv")
            doc.save(original)
        scanned = folder / f"policy-{lang}.pdf"
        scan_pages(original, scanned, {1}, dpi)
        _ORIGINALS[scanned] = original
        out.append((scanned, 1, lang))
    return out


_ORIGINALS: dict[Path, Path] = {}  # scanned file -> its original (set while building)


def _original_text(scanned: Path, page_no: int) -> str:
    with pymupdf.open(_ORIGINALS[scanned]) as doc:
        return doc.load_page(page_no - 1).get_text("text", sort=False)


def _default_tessdata() -> str:
    for candidate in ("/usr/share/tesseract-ocr/5/tessdata", "/usr/share/tesseract-ocr/4.00/tessdata",
                      "/usr/share/tessdata"):
        if Path(candidate).is_dir():
            return candidate
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/data/financebench-dev")
    ap.add_argument("--csr", type=Path, default=Path(__file__).resolve().parents[1]
                    / "../shared/data/csr-samples/BHP_Climate_Change_Report_2020.pdf")
    ap.add_argument("--csr-step", type=int, default=4, help="scan every N-th page of the CSR sample")
    ap.add_argument("--dpi", type=int, nargs="+", default=[150, 300], help="scan resolutions")
    ap.add_argument("--ocr-dpi", type=int, default=300, help="EVIDENTIA_OCR_DPI: resolution OCR renders at")
    ap.add_argument("--min-queries", type=int, default=3, help="filings with at least this many queries")
    ap.add_argument("--others", type=int, default=8, help="non-evidence pages scanned per filing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compare-engines", type=int, default=4, metavar="N")
    ap.add_argument("--language-cost", type=int, default=4, metavar="N")
    ap.add_argument("--tessdata", default=None)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="workers part: Tesseract processes at once")
    ap.add_argument("--workers-pages", type=int, default=8, help="workers part: pages of the CSR sample read")
    ap.add_argument("--parts", default="retrieval,csr,engines,languages",
                    help="comma-separated parts to run, of retrieval, csr, engines, languages, workers (engines "
                         "and languages scan their sample pages themselves)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))

    engine = OcrEngine.probe(dpi=args.ocr_dpi, tessdata=args.tessdata)
    if not engine.available:
        print(f"error: {engine.problem}", file=sys.stderr)
        return 2
    data = args.data.resolve()
    queries = [json.loads(line) for line in (data / "queries.jsonl").read_text().splitlines() if line.strip()]
    chosen, scanned = choose(queries, args.min_queries, args.others, args.seed, data / "pdfs")
    subset = [q for qs in chosen.values() for q in qs]
    detector = LanguageDetector()
    report: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}",
                    "queries": len(subset), "filings": len(chosen),
                    "scanned_pages": {d: sorted(p) for d, p in scanned.items()},
                    "ocr_dpi": args.ocr_dpi, "languages": engine.languages}
    print(f"{len(subset)} queries over {len(chosen)} filings; {sum(map(len, scanned.values()))} pages scanned "
          f"(evidence pages + {args.others} others per filing); load {os.getloadavg()}", file=sys.stderr)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        originals = [data / "pdfs" / f"{d}.pdf" for d in sorted(chosen)]
        if "retrieval" in parts:
            base, _ = index_docs(originals, tmp / "index-text", detector, OcrEngine(mode="off"))
            report["text"] = recall_scores(base, subset, detector)
            print(f"text layer: R@3 {report['text']['R@3']} R@20 {report['text']['R@20']}", file=sys.stderr)
            report["scans"] = {}
            for dpi in args.dpi:
                folder = tmp / f"scans-{dpi}"
                folder.mkdir()
                paths = []
                for src in originals:
                    dst = folder / src.name
                    scan_pages(src, dst, scanned[src.stem], dpi)
                    _ORIGINALS[dst] = src
                    paths.append(dst)
                t0 = time.perf_counter()
                backend, documents = index_docs(paths, tmp / f"index-{dpi}", detector, engine)
                wall = time.perf_counter() - t0
                matched = ref_total = hyp_total = 0
                sources: Counter[str] = Counter()
                confidences = []
                for (document, _), src in zip(documents, originals):
                    with pymupdf.open(src) as original:
                        for p in scanned[src.stem]:
                            page = document.pages[p - 1]
                            sources[page.text_source] += 1
                            if page.ocr_confidence is not None:
                                confidences.append(page.ocr_confidence)
                            m, r, h = word_scores(original.load_page(p - 1).get_text("text", sort=False), page.raw_text)
                            matched, ref_total, hyp_total = matched + m, ref_total + r, hyp_total + h
                ocr_pages = sum(d.ocr_pages for d, _ in documents)
                ocr_s = sum(d.ocr_seconds for d, _ in documents)
                scores = recall_scores(backend, subset, detector)
                result = {
                    "R@3": scores["R@3"], "R@20": scores["R@20"],
                    "R@3_ratio": round(scores["R@3"] / report["text"]["R@3"], 3) if report["text"]["R@3"] else None,
                    "word_recall": round(matched / max(1, ref_total), 3),
                    "word_precision": round(matched / max(1, hyp_total), 3),
                    "sources_of_scanned_pages": dict(sources),
                    "mean_confidence": round(sum(confidences) / len(confidences), 1) if confidences else None,
                    "ocr_pages": ocr_pages, "ocr_seconds": round(ocr_s, 1),
                    "ocr_pages_per_s": round(ocr_pages / ocr_s, 3) if ocr_s else None,
                    "extract_wall_s": round(wall, 1),
                    "changed_queries": {qid: (report["text"]["per_query"][qid], v)
                                        for qid, v in scores["per_query"].items()
                                        if v != report["text"]["per_query"][qid]},
                }
                report["scans"][dpi] = result
                print(f"scanned at {dpi} dpi: R@3 {result['R@3']} R@20 {result['R@20']} (x{result['R@3_ratio']} of text), "
                      f"word recall {result['word_recall']} precision {result['word_precision']}, "
                      f"{ocr_pages} pages OCR'd at {result['ocr_pages_per_s']} pages/s; load {os.getloadavg()}",
                      file=sys.stderr)

        if "csr" in parts and args.csr and args.csr.is_file():
            with pymupdf.open(args.csr) as doc:
                n = doc.page_count
            pages = set(range(1, n + 1, args.csr_step))
            report["csr"] = {}
            for dpi in args.dpi:
                # only the chosen pages, all scanned: no text layer gives a language prior
                dst, subset_pdf = scan_subset(args.csr, sorted(pages), dpi, tmp, f"csr-{dpi}")
                t0 = time.perf_counter()
                document = extract_pages(dst, "csr", detector, ocr=engine)
                wall = time.perf_counter() - t0
                matched = ref_total = hyp_total = 0
                with pymupdf.open(subset_pdf) as original:
                    for page in document.pages:
                        m, r, h = word_scores(original.load_page(page.page - 1).get_text(), page.raw_text)
                        matched, ref_total, hyp_total = matched + m, ref_total + r, hyp_total + h
                report["csr"][dpi] = {
                    "pages": document.page_count, "ocr_pages": document.ocr_pages,
                    "word_recall": round(matched / max(1, ref_total), 3),
                    "word_precision": round(matched / max(1, hyp_total), 3),
                    "mean_confidence": document.ocr_confidence,
                    "ocr_pages_per_s": round(document.ocr_pages / document.ocr_seconds, 3) if document.ocr_seconds else None,
                    "wall_s": round(wall, 1), "languages": document.languages,
                }
                print(f"CSR {args.csr.name}, {len(pages)} pages scanned whole at {dpi} dpi: {report['csr'][dpi]}",
                      file=sys.stderr)

        if "workers" in parts and args.csr and args.csr.is_file():
            with pymupdf.open(args.csr) as doc:
                pages = list(range(1, doc.page_count + 1, args.csr_step))[: args.workers_pages]
            scan, _ = scan_subset(args.csr, pages, max(args.dpi), tmp, "csr-workers")
            report["workers"] = workers_speed(scan, engine, args.workers, detector)
            for row in report["workers"]:
                print(f"workers: {args.csr.name}, pages {pages} scanned at {max(args.dpi)} dpi, OCR at "
                      f"{args.ocr_dpi} dpi: {row}", file=sys.stderr)

        # evidence pages (the first of each query, at most N), each scanned alone
        wanted = max(args.compare_engines, args.language_cost)
        sample = []
        for d, qs in sorted(chosen.items()):
            for p in sorted({q["relevant_pages"][0] for q in qs}):
                if len(sample) >= wanted:
                    break
                original = tmp / f"{d}-p{p}-text.pdf"
                with pymupdf.open(data / "pdfs" / f"{d}.pdf") as doc, pymupdf.open() as out:
                    out.insert_pdf(doc, from_page=p - 1, to_page=p - 1)
                    out.save(original)
                page_scan = tmp / f"{d}-p{p}.pdf"
                scan_pages(original, page_scan, {1}, max(args.dpi))
                _ORIGINALS[page_scan] = original
                sample.append((page_scan, 1))
        if "engines" in parts and args.compare_engines:
            report["engines"] = compare_engines(sample[: args.compare_engines], args.ocr_dpi, args.tessdata)
            for row in report["engines"]:
                print(f"engines: {row}", file=sys.stderr)
        if "languages" in parts and args.language_cost:
            pages = [(p, n, "en") for p, n in sample[: args.language_cost]] + foreign_pages(tmp, max(args.dpi))
            report["language_cost"] = language_cost(pages, args.ocr_dpi, args.tessdata)
            for row in report["language_cost"]:
                print(f"languages: {row}", file=sys.stderr)
    report["load_after"] = os.getloadavg()
    if "text" in report:
        report["text"].pop("per_query", None)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(json.dumps({k: v for k, v in report.items() if k != "scanned_pages"}, indent=1, default=str))
    return 1 if any(not row["same_pages_as_first"] for row in report.get("workers", ())) else 0


if __name__ == "__main__":
    raise SystemExit(main())
