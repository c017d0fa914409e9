"""Generators of hostile PDFs (issue #15), shared by the tests and bench/bench_hostile.py.

Every file is built here, in seconds, with PyMuPDF and zlib: a small file whose
page content stream inflates to many megabytes of text operators (or of
spaces), one such stream shared by many pages, a page holding a huge image,
random bytes after a ``%PDF-`` header, a header-only file, an HTML polyglot and
a real PDF cut in half. The compressed streams are produced incrementally, so
building a 256 MB bomb never holds 256 MB in memory.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pymupdf

LINE = b"BT /helv 10 Tf 20 700 Td (Sustainability report revenue 2023 emissions tonnes) Tj ET\n"


def _deflate(chunk: bytes, total_bytes: int) -> bytes:
    """``chunk`` repeated until ``total_bytes``, deflated without materialising it."""
    comp = zlib.compressobj(9)
    block = chunk * max(1, (1 << 20) // len(chunk))
    parts, done = [], 0
    while done < total_bytes:
        piece = block[: total_bytes - done]
        parts.append(comp.compress(piece))
        done += len(piece)
    parts.append(comp.flush())
    return b"".join(parts)


def _base(pages: int) -> pymupdf.Document:
    doc = pymupdf.open()
    for _ in range(pages):
        page = doc.new_page()
        page.insert_text((72, 72), "x", fontname="helv")  # gives every page a /helv font resource
    return doc


def _set_raw_stream(doc: pymupdf.Document, xref: int, deflated: bytes) -> None:
    doc.update_stream(xref, deflated, compress=False)
    doc.xref_set_key(xref, "Filter", "/FlateDecode")


def content_bomb(path: Path, inflated_mb: float = 256, chunk: bytes = LINE) -> Path:
    """One page whose content stream inflates to ``inflated_mb`` MB of text operators."""
    doc = _base(1)
    page = doc[0]
    xref = page.get_contents()[0]
    _set_raw_stream(doc, xref, _deflate(chunk, int(inflated_mb * (1 << 20))))
    doc.save(path)
    doc.close()
    return Path(path)


def spaces_bomb(path: Path, inflated_mb: float = 1024) -> Path:
    """One page whose content stream inflates to ``inflated_mb`` MB of spaces
    (no text at all: only the parsing costs)."""
    return content_bomb(path, inflated_mb, chunk=b" " * 4096)


def shared_stream(path: Path, pages: int = 10, inflated_mb: float = 64, chunk: bytes = LINE) -> Path:
    """``pages`` pages whose /Contents all point at one stream inflating to ``inflated_mb`` MB:
    the file stays small, every page costs the whole stream."""
    doc = _base(pages)
    shared = doc[0].get_contents()[0]
    _set_raw_stream(doc, shared, _deflate(chunk, int(inflated_mb * (1 << 20))))
    for page in doc:
        doc.xref_set_key(page.xref, "Contents", f"{shared} 0 R")
    doc.save(path, garbage=1)
    doc.close()
    return Path(path)


def huge_image(path: Path, side: int = 20000) -> Path:
    """One page drawing a ``side`` x ``side`` grey image (a few KB deflated,
    ``side``² bytes once decoded): rendering it at full size would need GBs."""
    doc = pymupdf.open()
    page = doc.new_page(width=14400, height=14400)  # the largest page size PDF allows
    page.insert_text((72, 72), "A page with one very large image.", fontname="helv")
    # a tiny placeholder image, then its stream swapped for the huge one
    pix = pymupdf.Pixmap(pymupdf.csGRAY, pymupdf.IRect(0, 0, 1, 1), False)
    xref = page.insert_image(page.rect, pixmap=pix)
    doc.update_stream(xref, _deflate(b"\x80" * side, side * side), compress=False)
    for key, value in (("Filter", "/FlateDecode"), ("Width", str(side)), ("Height", str(side)),
                       ("BitsPerComponent", "8"), ("ColorSpace", "/DeviceGray"), ("DecodeParms", "null"),
                       ("SMask", "null")):
        doc.xref_set_key(xref, key, value)
    doc.save(path)
    doc.close()
    return Path(path)


def random_after_header(path: Path, size: int = 200_000, seed: int = 15) -> Path:
    rnd = __import__("random").Random(seed)
    Path(path).write_bytes(b"%PDF-1.7\n" + bytes(rnd.getrandbits(8) for _ in range(size)))
    return Path(path)


def header_only(path: Path) -> Path:
    Path(path).write_bytes(b"%PDF-1.7\n")
    return Path(path)


def html_polyglot(path: Path) -> Path:
    Path(path).write_bytes(b"<!DOCTYPE html><html><head><title>%PDF-1.4</title></head>"
                           b"<body><script>alert(1)</script>%PDF-1.4 1 0 obj << >> endobj</body></html>\n")
    return Path(path)


def real_report(path: Path, pages: int = 30) -> Path:
    """A plain multi-page text PDF (the victim for ``truncated``)."""
    doc = pymupdf.open()
    for i in range(pages):
        page = doc.new_page()
        page.insert_text((72, 72), f"Annual report page {i + 1}", fontname="helv", fontsize=14)
        y = 100
        for line in range(40):
            page.insert_text((72, y), f"Revenue line {line} of page {i + 1}: 12,450 tonnes CO2e in 2023.",
                             fontname="helv", fontsize=9)
            y += 15
    doc.save(path, garbage=3, deflate=True)
    doc.close()
    return Path(path)


def truncated(path: Path, source: Path | None = None) -> Path:
    """A real PDF cut in half (the xref table and trailer are lost)."""
    if source is None:
        source = real_report(Path(str(path) + ".whole.pdf"))
    data = Path(source).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])
    return Path(path)


def long_page(path: Path, chars: int = 50_000) -> Path:
    """A normal-looking page holding ``chars`` characters of text (for per-page caps)."""
    doc = pymupdf.open()
    page = doc.new_page(width=2000, height=14000)
    line = "emissions revenue tonnes 2023 " * 6
    text = (line + "\n") * (chars // (len(line) + 1) + 1)
    page.insert_textbox(page.rect, text, fontname="helv", fontsize=4)
    doc.save(path, deflate=True)
    doc.close()
    return Path(path)


HOSTILE = {
    # name -> (builder, a word the failure reason must contain)
    "content_bomb": content_bomb,
    "spaces_bomb": spaces_bomb,
    "shared_stream": shared_stream,
    "huge_image": huge_image,
    "random_after_header": random_after_header,
    "header_only": header_only,
    "html_polyglot": html_polyglot,
    "truncated": truncated,
}


if __name__ == "__main__":  # python -m tests.utils.hostile_pdfs OUT_DIR: writes every file, for a look
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    for name, build in HOSTILE.items():
        p = build(out / f"{name}.pdf")
        print(f"{p}: {os.path.getsize(p)} bytes")
