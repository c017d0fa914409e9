// A document's line in the list: what it holds once indexed, or how far indexing
// has gone (GET /v1/documents/{id}: status and progress). A pure function, so the
// browser tests can call it with any state.

export function documentStatus(d) {
  if (d.status === "ready") {
    const pages = d.pages === 1 ? "1 page" : `${d.pages} pages`;
    const parts = [pages];
    if (d.ocr_pages) {
      const conf = d.ocr_confidence == null ? "" : ` (confidence ${Math.round(d.ocr_confidence)}%)`;
      parts.push(`${d.ocr_pages} read by OCR${conf}`);
    }
    if (d.unread_pages) parts.push(`${d.unread_pages} scanned page${d.unread_pages === 1 ? "" : "s"} not read`);
    const blank = (d.empty_pages || 0) - (d.unread_pages || 0);
    if (blank > 0) parts.push(`${blank} without text`);
    return parts.join(", ");
  }
  if (d.status === "failed") return d.reason || "indexing failed";
  if (d.status === "queued") return "waiting to be indexed…";
  const p = d.progress;
  // OCR takes seconds a page: a scan shows how far it has gone (ocr_pages_left counts
  // the pages Tesseract has still to read: not the blank ones, nor short text pages)
  if (p && p.ocr_pages_left) {
    // "read" counts pages OCR turned into text: after a scan that held none, "0 read, 1 to go"
    // read as if nothing had happened, so a count of 0 is not said
    const read = p.ocr_pages ? `${p.ocr_pages} read, ` : "";
    return `reading scans by OCR: ${read}${p.ocr_pages_left} to go (${p.pages_total} pages)…`;
  }
  if (p && !p.pages_total) return `reading scans by OCR: ${p.ocr_pages} pages…`;
  if (p) return `indexing ${p.pages_done} / ${p.pages_total} pages…`;
  return "indexing…";
}
