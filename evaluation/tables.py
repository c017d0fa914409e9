"""Metric tables from an evaluation summary (``runner.summarize``): rows of
formatted cells, rendered as plain text by the CLI and as HTML by the report."""

from __future__ import annotations

from typing import Optional

COUNT_KEYS = ("queries", "queries_without_relevant", "queries_without_pages", "fallbacks", "scored_pages")
LABELS = {
    "queries": "queries",
    "queries_without_relevant": "queries w/o relevant page",
    "pages_per_query": "pages returned/query",
    "queries_without_pages": "queries w/o page returned",
    "fallbacks": "reranker fallbacks",
    "scored_pages": "pages scored (calibration)",
}


def fmt(key: str, value) -> str:
    if value is None:
        return "-"
    if key in COUNT_KEYS:
        return str(int(value))
    if key == "pages_per_query":
        return f"{value:.1f}"
    return f"{value:.3f}"


Table = tuple[list[str], list[list[str]]]  # header, rows of cells


def main_table(summary: dict) -> Table:
    """Metrics as rows, configurations as columns."""
    configs = summary["configs"]
    labels = list(configs)
    keys = (["queries", "queries_without_relevant"] + list(summary["metrics"])
            + ["pages_per_query", "queries_without_pages"])
    if any(c["fallbacks"] for c in configs.values()):
        keys.append("fallbacks")
    if any(c["probabilistic"] for c in configs.values()):
        keys += ["ECE", "Brier", "AUROC", "scored_pages"]
    rows = [[LABELS.get(key, key)] + [fmt(key, configs[label].get(key)) for label in labels] for key in keys]
    return ["metric"] + labels, rows


def category_table(summary: dict, name: str) -> Table:
    """One row per category value (and configuration, when several)."""
    keys = ["queries"] + list(summary["metrics"])
    labels = list(summary["configs"])
    several = len(labels) > 1
    header = [name] + (["config"] if several else []) + ["n" if k == "queries" else k for k in keys]
    rows = []
    for value, per_config in summary["categories"][name].items():
        for i, label in enumerate(labels):
            m = per_config[label]
            first = [value if i == 0 else ""] + ([label] if several else [])
            rows.append(first + [fmt(k, m.get(k)) for k in keys])
    return header, rows


def models(summary: dict) -> list[str]:
    """One line per reranker model scored, naming its configurations: the same command
    scores another model once one is promoted or EVIDENTIA_CLASSIFIER_MODEL is set."""
    by_version: dict[str, list[str]] = {}
    for label, c in summary["configs"].items():
        if c.get("model_version"):
            by_version.setdefault(c["model_version"], []).append(label)
    return [f"model of {', '.join(labels)}: {version}" for version, labels in by_version.items()]


def notes(summary: dict) -> list[str]:
    pool = summary["pool_size"]
    key = next((k for k in summary["metrics"] if k.startswith("pool R@")), f"R@{pool}")
    out = [f"{key}: recall of the first-stage candidate pool (top {pool}), "
           "the most a reranker can reach by reordering it."]
    skipped = max((c["queries_without_relevant"] for c in summary["configs"].values()), default=0)
    if skipped:
        out.append(f"{skipped} quer{'y' if skipped == 1 else 'ies'} without relevant pages: counted in P@k "
                   "(as 0), skipped in R@k, MRR, nDCG and MAP.")
    if any(c["probabilistic"] for c in summary["configs"].values()):
        out.append("ECE (10 bins), Brier and AUROC: over every pool page the reranker scored, "
                   "before the threshold (label = page is relevant).")
    return models(summary) + out


def render_text(table: Table, title: Optional[str] = None) -> str:
    header, rows = table
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    # Leading text columns (the metric name, category value, config) left-aligned; numbers right.
    text_cols = 1
    while text_cols < len(header) and header[text_cols] == "config":
        text_cols += 1

    def line(cells):
        parts = [str(c).ljust(widths[i]) if i < text_cols else str(c).rjust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    lines = [title] if title else []
    lines.append(line(header))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(line(r) for r in rows)
    return "\n".join(lines)
