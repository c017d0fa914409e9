"""Shared fixtures: every PDF the tests need is generated here, into tmp_path,
so the suite runs on a fresh clone (no ``../shared``, nothing binary checked in)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pymupdf
import pytest

from evidentia.language import LanguageDetector
from evidentia.samples import write_pdf

# One page per language, a few realistic report sentences each (400+ characters,
# plenty for langdetect). Every page mentions 2023 so that a "2023" query hits all.
LANGUAGE_PAGES: dict[str, str] = {
    "en": (
        "Greenhouse gas emissions and energy use\n\n"
        "In 2023 our total Scope 1 and Scope 2 greenhouse gas emissions were 12,450 tonnes of carbon "
        "dioxide equivalent, a reduction of 12.5 % compared with the previous year. The decrease was "
        "driven mainly by the installation of solar panels at our largest factory and by replacing the "
        "diesel forklift fleet with electric vehicles. We have committed to a science-based target of net "
        "zero emissions across our operations by 2040, and progress is reviewed every quarter by the board."
    ),
    "fr": (
        "Politique d'achats responsables\n\n"
        "Tous nos fournisseurs doivent signer le code de conduite, qui interdit le travail des enfants et "
        "le travail forcé et exige le respect des normes environnementales locales. En 2023, 87 % des "
        "fournisseurs stratégiques ont été audités sur les droits humains et l'environnement par un "
        "organisme indépendant. Les fournisseurs qui ne respectent pas nos exigences reçoivent un plan "
        "d'action correctif et sont de nouveau évalués dans un délai de six mois."
    ),
    "de": (
        "Energiemanagement und Klimaschutz\n\n"
        "Alle unsere Produktionsstandorte sind nach ISO 50001 zertifiziert und werden jedes Jahr von "
        "einer unabhängigen Stelle geprüft. Im Jahr 2023 stammten 64 % des verbrauchten Stroms aus "
        "erneuerbaren Energien, vor allem aus Wind- und Solarenergie. Bis zum Ende des Jahrzehnts wollen "
        "wir den gesamten Strombedarf unserer Werke vollständig aus erneuerbaren Quellen decken und den "
        "Gasverbrauch der Heizungsanlagen deutlich senken."
    ),
    "es": (
        "Gestión del agua y de los residuos\n\n"
        "Durante el año 2023 redujimos el consumo de agua en nuestras plantas de producción un 18 % "
        "gracias a la reutilización del agua de refrigeración y a la reparación de fugas en la red de "
        "distribución. Además, el 92 % de los residuos generados fueron reciclados o valorizados, y "
        "ninguno de nuestros centros envió residuos peligrosos al vertedero. Nuestro objetivo para los "
        "próximos años es alcanzar el residuo cero en todas las fábricas."
    ),
    "it": (
        "Salute e sicurezza dei lavoratori\n\n"
        "Nel corso del 2023 l'indice di frequenza degli infortuni è sceso a 1,2 per milione di ore "
        "lavorate, il valore più basso degli ultimi dieci anni. Tutti i dipendenti partecipano ogni anno "
        "a un corso di formazione sulla sicurezza e le imprese appaltatrici vengono controllate "
        "regolarmente dai nostri responsabili. Abbiamo inoltre introdotto un sistema digitale per "
        "segnalare i quasi incidenti, che permette di intervenire prima che accada un infortunio."
    ),
    "pt": (
        "Diversidade e inclusão\n\n"
        "Em 2023, as mulheres representavam 38 % dos cargos de gestão da empresa, contra 31 % no ano "
        "anterior. Lançámos um programa de mentoria para jovens engenheiras e revimos os nossos processos "
        "de recrutamento para eliminar enviesamentos. Todos os colaboradores receberam formação sobre "
        "igualdade de oportunidades, e a diferença salarial entre homens e mulheres é analisada todos os "
        "anos por uma comissão independente que apresenta as suas conclusões à administração."
    ),
    "nl": (
        "Maatschappelijke betrokkenheid\n\n"
        "In 2023 hebben onze medewerkers samen meer dan 4200 uur vrijwilligerswerk gedaan voor lokale "
        "goede doelen, zoals voedselbanken en scholen in de buurt van onze fabrieken. Daarnaast hebben wij "
        "een fonds opgericht dat jaarlijks projecten ondersteunt op het gebied van onderwijs en duurzame "
        "energie. Elk jaar kiezen de medewerkers zelf welke organisaties een bijdrage krijgen, en de "
        "resultaten worden in dit verslag openbaar gemaakt."
    ),
}

# A short page of loanwords: enough letters for langdetect to answer, but with a
# low probability (German, about 0.43, with seed 0), so the document prior decides.
AMBIGUOUS_PAGE = "Annexe Reporting Cinema Tableau Date Design Business"

# A hand-written PDF whose page tree is empty: PyMuPDF refuses to save one itself.
ZERO_PAGE_PDF = b"""%PDF-1.4
1 0 obj
<< /Type /Catalog /Pages 2 0 R >>
endobj
2 0 obj
<< /Type /Pages /Kids [] /Count 0 >>
endobj
trailer
<< /Root 1 0 R >>
%%EOF
"""


@dataclass(frozen=True)
class SamplePdf:
    path: Path
    pages: list[str]  # text written on each page ("" for the empty and image pages)
    languages: list[str | None]  # expected language of each page

    @property
    def doc_id(self) -> str:
        return self.path.stem


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path, monkeypatch):
    """Nothing a test runs may touch the user's ~/.evidentia. Indexing skips page
    embeddings (seconds of CPU per run) unless a test turns them on (tests/retriever/test_dense.py),
    nor OCR (tests/indexer/test_ocr.py turns it on)."""
    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(tmp_path / "evidentia-data"))
    monkeypatch.setenv("EVIDENTIA_DENSE", "off")
    monkeypatch.setenv("EVIDENTIA_OCR", "off")


@pytest.fixture
def cli_env(tmp_path, monkeypatch) -> Path:
    """Environment for CLI runs: embedded backend in a fresh data dir, default settings."""
    data_dir = tmp_path / "cli-data"
    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(data_dir))
    for name in ("EVIDENTIA_BACKEND", "EVIDENTIA_POOL_SIZE", "EVIDENTIA_LANGUAGE_PROBE_CHARS"):
        monkeypatch.delenv(name, raising=False)
    return data_dir


@pytest.fixture(scope="session")
def detector() -> LanguageDetector:
    return LanguageDetector()


@pytest.fixture(scope="session")
def language_pages() -> dict[str, str]:
    return dict(LANGUAGE_PAGES)


@pytest.fixture(scope="session")
def ambiguous_page() -> str:
    return AMBIGUOUS_PAGE


@pytest.fixture
def backend(tmp_path):
    from evidentia.retriever.tantivy_backend import TantivyBackend

    with TantivyBackend(tmp_path / "index") as b:
        yield b


@pytest.fixture
def multilingual_pdf(tmp_path) -> SamplePdf:
    """Pages 1-7: en, fr, de, es, it, pt, nl; page 8 blank; page 9 a picture only."""
    texts = list(LANGUAGE_PAGES.values()) + ["", ""]
    languages: list[str | None] = list(LANGUAGE_PAGES) + [None, None]
    folder = tmp_path / "pdfs"
    folder.mkdir(exist_ok=True)
    path = write_pdf(folder / "multilingual-report.pdf", texts, image_pages={8})
    return SamplePdf(path=path, pages=texts, languages=languages)


@pytest.fixture
def make_pdf(tmp_path):
    """make_pdf(name, pages, image_pages=None) -> path of a new PDF under tmp_path/pdfs."""
    folder = tmp_path / "pdfs"

    def make(name: str, pages: list[str], image_pages: set[int] | None = None) -> Path:
        folder.mkdir(exist_ok=True)
        return write_pdf(folder / name, pages, image_pages=image_pages)

    return make


@pytest.fixture
def bad_pdfs(tmp_path) -> dict[str, Path]:
    """One file per kind of bad input, all in tmp_path/bad, keyed by kind."""
    folder = tmp_path / "bad"
    folder.mkdir()
    good = write_pdf(tmp_path / "bad-source.pdf", [LANGUAGE_PAGES["en"], LANGUAGE_PAGES["fr"]])

    encrypted = folder / "encrypted.pdf"
    with pymupdf.open(good) as doc:
        doc.save(encrypted, encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="x", owner_pw="y")

    # the real header line, then bytes that are no PDF syntax at all: PyMuPDF
    # cannot repair this (a plain truncation it sometimes can)
    corrupted = folder / "corrupted.pdf"
    header = good.read_bytes().split(b"\n", 1)[0] + b"\n"
    corrupted.write_bytes(header + bytes((i * 37 + 11) % 256 for i in range(4096)))

    no_pages = folder / "no-pages.pdf"
    no_pages.write_bytes(ZERO_PAGE_PDF)

    not_pdf = folder / "notes.pdf"
    not_pdf.write_text("Meeting notes: send the sustainability report to the auditors by Friday.\n")

    return {"encrypted": encrypted, "corrupted": corrupted, "no_pages": no_pages, "not_pdf": not_pdf}

