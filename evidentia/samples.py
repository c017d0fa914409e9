"""Sample PDFs generated on the fly, for the demo and the tests: nothing binary
ships with the project and ``../shared`` is not needed."""

from __future__ import annotations

from pathlib import Path

import pymupdf

# A small supplier sustainability report: one page per topic, in several languages.
SAMPLE_REPORT_PAGES: list[str] = [
    "Acme Components Sustainability Report 2023\n\nThis report covers our environmental, social "
    "and governance performance for the financial year 2023 across all manufacturing sites.",
    "Greenhouse gas emissions\n\nIn 2023 our total Scope 1 and Scope 2 greenhouse gas emissions "
    "were 12,450 tonnes of CO2 equivalent, a reduction of 12.5 % compared with 2022. "
    "We have committed to a science-based target of net zero emissions by 2040.",
    "Health and safety\n\nThe lost time injury frequency rate fell to 0.8 per million hours worked. "
    "All employees receive annual safety training and contractors are audited every year.",
    "",  # a blank page, as reports often have
    "Politique d'achats responsables\n\nNos fournisseurs signent le code de conduite qui interdit "
    "le travail des enfants et le travail forcé. En 2023, 87 % des fournisseurs ont été audités "
    "sur les droits humains et l'environnement.",
    "Energiemanagement\n\nUnsere Standorte sind nach ISO 50001 zertifiziert. Im Jahr 2023 stammten "
    "64 % des Stroms aus erneuerbaren Energien, vor allem aus Wind- und Solarenergie.",
]

SAMPLE_QUESTION = "What were the company's Scope 1 and 2 greenhouse gas emissions in 2023?"
SAMPLE_ANSWER = "12450 tCO2e, down 12.5% on 2022."


def write_pdf(path: Path, pages: list[str | None], image_pages: set[int] | None = None,
              fontsize: float = 11) -> Path:
    """Write a PDF with one page per entry of ``pages`` (text wrapped to the page).
    Pages whose 0-based index is in ``image_pages`` hold only a picture, like a scan."""
    path = Path(path)
    doc = pymupdf.open()
    for i, text in enumerate(pages):
        page = doc.new_page(width=595, height=842)  # A4 in points
        if image_pages and i in image_pages:
            pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 64, 64), False)
            pix.set_rect(pix.irect, (120, 160, 200))
            page.insert_image(pymupdf.Rect(72, 72, 520, 520), pixmap=pix)
        elif text:
            page.insert_textbox(pymupdf.Rect(56, 56, 540, 790), text, fontsize=fontsize, fontname="helv")
    doc.save(path)
    doc.close()
    return path


def write_sample_report(path: Path) -> Path:
    return write_pdf(path, SAMPLE_REPORT_PAGES)
