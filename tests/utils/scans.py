"""Generated PDFs for the OCR tests: scans (text written on a page, rendered and put
back as an image-only page) and figures printed as images under a caption."""

from __future__ import annotations

from pathlib import Path

import pymupdf

TEXTS = {
    "en": ("Environmental management certificate. The company Northwind Metals operates an environmental "
           "management system that meets the requirements of ISO 14001 for the production of copper wire. "
           "Greenhouse gas emissions are measured every year and reduced by recycling the scrap."),
    "fr": ("Certificat de management environnemental. La société Dupont et Fils applique un système de "
           "management environnemental conforme aux exigences de la norme pour la fabrication de câbles. "
           "Les émissions de gaz à effet de serre sont mesurées chaque année et réduites."),
    "de": ("Zertifikat für Umweltmanagement. Die Firma Müller und Söhne betreibt ein Umweltmanagementsystem, "
           "das die Anforderungen der Norm für die Herstellung von Kupferdraht erfüllt. Die Treibhausgasemissionen "
           "werden jedes Jahr gemessen und durch die Wiederverwertung der Abfälle gesenkt."),
}
FILLER = ("The board meets four times a year; its members are elected by the shareholders for three years. "
          "Customer support answers requests by telephone and chat from eight in the morning until six.")


def write_page(doc: pymupdf.Document, text: str) -> pymupdf.Page:
    page = doc.new_page(width=420, height=300)  # A6 landscape: quick to OCR
    page.insert_textbox(pymupdf.Rect(24, 24, 396, 280), text, fontsize=12, fontname="helv")
    return page


def scanned_pdf(path: Path, pages: list[str | None], dpi: int = 150, junk_layer: str | None = None) -> Path:
    """An image-only PDF: each entry rendered to a picture (None: a page with a text layer
    of FILLER, as a digital page among scans). ``junk_layer`` puts invisible glyph junk
    over each scan, like a broken font without a Unicode map."""
    out = pymupdf.open()
    for text in pages:
        if text is None:
            write_page(out, FILLER)
            continue
        src = pymupdf.open()
        pix = write_page(src, text).get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY)
        page = out.new_page(width=420, height=300)
        page.insert_image(page.rect, pixmap=pix)
        if junk_layer:
            page.insert_textbox(pymupdf.Rect(24, 24, 396, 280), junk_layer, fontsize=8, render_mode=3)
        src.close()
    out.save(path)
    out.close()
    return path


CAPTION = "Figure 2: Overview of the certified management system, by site and by year of its audit."


def figure_pdf(path: Path, picture: str | None) -> Path:
    """A page whose only text layer is a caption above a picture covering most of it:
    ``picture`` written and rendered into the image (a figure printed as an image,
    a table of figures say), or None for a photo (a grey gradient, no text)."""
    out = pymupdf.open()
    page = out.new_page(width=420, height=300)
    page.insert_text((24, 20), CAPTION, fontsize=7, fontname="helv")
    frame = pymupdf.Rect(0, 30, 420, 300)
    if picture is not None:
        src = pymupdf.open()
        pix = write_page(src, picture).get_pixmap(dpi=150, colorspace=pymupdf.csGRAY)
        page.insert_image(frame, pixmap=pix)
        src.close()
    else:
        pix = pymupdf.Pixmap(pymupdf.csGRAY, pymupdf.IRect(0, 0, 420, 270), False)
        pix.set_rect(pix.irect, (128,))
        for x in range(0, 420, 6):  # soft vertical bands: a picture, nothing to read
            pix.set_rect(pymupdf.IRect(x, 0, x + 3, 270), (110 + x % 40,))
        page.insert_image(frame, pixmap=pix)
    out.save(path)
    out.close()
    return path
