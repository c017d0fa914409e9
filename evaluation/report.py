"""``evidentia eval --report DIR``: PNG plots and one self-contained index.html.

The PNGs are written to DIR and also embedded in index.html as base64 data URIs,
so the page can be mailed or archived alone. matplotlib (Agg) is imported here
only, when a report is asked for.
"""

from __future__ import annotations

import base64
import html
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from evidentia.evaluation import metrics, tables
from evidentia.evaluation.queries import category_fields, category_of
from evidentia.evaluation.runner import ConfigRun, pass_label, reliability
from evidentia.reranker.relevance_model import MAX_POOL_SHARE, MIN_RECALL_KEPT

SWEEP_K = 3


def _slug(text: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "plot"
    slug, n = base, 2
    while slug in taken:
        slug, n = f"{base}-{n}", n + 1
    taken.add(slug)
    return slug


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    _pyplot().close(fig)
    return path


def _grouped_bars(ax, groups: Sequence[str], series: dict[str, list], ylabel: str) -> None:
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v is not None else 0.0 for v in values], width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30 if max((len(g) for g in groups), default=0) > 6 else 0, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def plot_metrics(summary: dict, path: Path) -> Path:
    plt = _pyplot()
    names = list(summary["metrics"])
    fig, ax = plt.subplots(figsize=(max(6, 1.0 * len(names) + 2), 4))
    _grouped_bars(ax, names, {label: [m.get(k) for k in names] for label, m in summary["configs"].items()}, "score")
    ax.set_title(f"Ranking metrics ({summary['queries']} queries)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _overlaps(a, b) -> bool:
    """Whether two display boxes (matplotlib Bbox) share more than an edge."""
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _crosses(box, p, q) -> bool:
    """Whether the segment p-q (display coordinates) passes through ``box`` (Liang-Barsky)."""
    (x0, y0), (x1, y1) = p, q
    dx, dy = x1 - x0, y1 - y0
    lo, hi = 0.0, 1.0
    for step, room in ((-dx, x0 - box.x0), (dx, box.x1 - x0), (-dy, y0 - box.y0), (dy, box.y1 - y0)):
        if step == 0:
            if room < 0:
                return False
            continue
        t = room / step
        if step < 0:
            lo = max(lo, t)
        else:
            hi = min(hi, t)
        if lo > hi:
            return False
    return True


def sweep_figure(label: str, rows: list[dict], thresholds: Sequence[float]):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r["threshold"] for r in rows]
    ax.plot(xs, [r[f"P@{SWEEP_K}"] for r in rows], marker="o", label=f"P@{SWEEP_K}")
    ax.plot(xs, [r[f"R@{SWEEP_K}"] for r in rows], marker="s", label=f"R@{SWEEP_K}")
    ax.set_xlabel("probability threshold (keep pages with p >= t)")
    ax.set_ylabel("score")
    ax.set_ylim(0, 1.05)
    ax.set_xlim(-0.02, 0.92)
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(xs, [r["pages_per_query"] for r in rows], color="grey", linestyle=":", label="pages/query")
    ax2.set_ylabel("pages returned per query", color="grey")
    ax2.set_ylim(bottom=0)
    # Each threshold's value above the top border, over its dashed line: at y 1.02 inside
    # the axes (top 1.05) it ran into the border; close thresholds are stacked in rows.
    marks = []
    for t in thresholds:
        ax.axvline(t, color="black", linestyle="--", linewidth=0.8)
        marks.append(ax.annotate(f"{t:g}", (t, 1), xycoords=ax.get_xaxis_transform(), xytext=(0, 2),
                                 textcoords="offset points", ha="center", va="bottom", fontsize=8,
                                 annotation_clip=False))
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    # below the axes: inside, it covered the curves wherever they ran (a newcomer's report, 8ap)
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    rows_used = 0
    if marks:
        fig.tight_layout()
        renderer = fig.canvas.get_renderer()
        placed: list[tuple[object, int]] = []  # (box, row)
        for mark in marks:
            box = mark.get_window_extent(renderer)
            row = 0
            while any(r == row and _overlaps(box, b) for b, r in placed):
                row += 1
            if row:
                mark.set_position((0, 2 + 10 * row))  # a line (10 points) higher per row
                box = mark.get_window_extent(renderer)
            placed.append((box, row))
        rows_used = 1 + max(r for _, r in placed)
    ax.set_title(f"{label}: threshold sweep", pad=max(14, 8 + 10 * rows_used))  # above the rows of values
    return fig


def plot_sweep(label: str, rows: list[dict], thresholds: Sequence[float], path: Path) -> Path:
    return _save(sweep_figure(label, rows, thresholds), path)


# Where a point's count may go (offset in points, alignment), in order of preference.
_LABEL_SPOTS = [((dx * f, dy * f), ha, va) for f in (1, 2)
                for (dx, dy), ha, va in (((5, 5), "left", "bottom"), ((-5, 5), "right", "bottom"),
                                         ((5, -5), "left", "top"), ((-5, -5), "right", "top"),
                                         ((0, 7), "center", "bottom"), ((0, -7), "center", "top"),
                                         ((7, 0), "left", "center"), ((-7, 0), "right", "center"))]


def _place_counts(fig, ax, line, labels: list) -> None:
    """Move each point's count label to the first spot where it covers no point, no
    segment of the curve (nor the diagonal), no other label and no legend, and stays
    inside the axes; else to the spot that covers least. At one fixed offset (up and to
    the right), a label sat on the curve rising from its point and on the point itself."""
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    scale = fig.dpi / 72
    points = ax.transData.transform(line.get_xydata())
    radius = (line.get_markersize() / 2 + line.get_markeredgewidth()) * scale
    curves = [ax.transData.transform(other.get_xydata()) for other in ax.get_lines()]
    segments = [(c[i], c[i + 1]) for c in curves for i in range(len(c) - 1)]
    frame = ax.get_window_extent(renderer)
    legend = ax.get_legend()
    taken = [legend.get_window_extent(renderer)] if legend is not None else []

    def cost(box) -> int:
        inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
        hits = sum((px - min(max(px, box.x0), box.x1)) ** 2 + (py - min(max(py, box.y0), box.y1)) ** 2
                   < radius ** 2 for px, py in points)
        hits += sum(_crosses(box, p, q) for p, q in segments) + sum(_overlaps(box, t) for t in taken)
        return hits + (0 if inside else 100)

    for text in labels:
        best = None
        for offset, ha, va in _LABEL_SPOTS:
            text.set_position(offset)
            text.set_ha(ha)
            text.set_va(va)
            score = cost(text.get_window_extent(renderer))
            if best is None or score < best[0]:
                best = (score, offset, ha, va)
            if score == 0:
                break
        _, offset, ha, va = best
        text.set_position(offset)
        text.set_ha(ha)
        text.set_va(va)
        taken.append(text.get_window_extent(renderer))


def reliability_figure(label: str, bins: list[metrics.ReliabilityBin], ece):
    plt = _pyplot()
    fig, (ax, axc) = plt.subplots(2, 1, figsize=(6, 6.5), gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect calibration")
    full = [b for b in bins if b.count]
    (curve,) = ax.plot([b.mean_probability for b in full], [b.observed_frequency for b in full], marker="o",
                       label=label)
    counts = [ax.annotate(f"n={b.count}", (b.mean_probability, b.observed_frequency), textcoords="offset points",
                          xytext=(5, 5), fontsize=7) for b in full]
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("observed frequency of relevant pages")
    ece_text = "-" if ece is None else f"{ece:.3f}"
    ax.set_title(f"{label}: reliability (ECE {ece_text})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    axc.bar([(b.lower + b.upper) / 2 for b in bins], [b.count for b in bins],
            width=[(b.upper - b.lower) * 0.9 for b in bins], color="tab:blue", alpha=0.6)
    for b in bins:
        if b.count:
            axc.text((b.lower + b.upper) / 2, b.count, str(b.count), ha="center", va="bottom", fontsize=7)
    # room above the tallest bar for its count, which otherwise ran into the top border
    axc.set_ylim(0, max([b.count for b in bins] + [1]) * 1.25)
    axc.set_xlabel("predicted probability (10 equal-width bins)")
    axc.set_ylabel("pages")
    _place_counts(fig, ax, curve, counts)
    return fig


def plot_reliability(label: str, bins: list[metrics.ReliabilityBin], ece, path: Path) -> Path:
    return _save(reliability_figure(label, bins, ece), path)


def plot_category(name: str, values: list[str], config_runs: Sequence[ConfigRun], pool_size: int, path: Path) -> Path:
    plt = _pyplot()
    p_series: dict[str, list] = {}
    r_series: dict[str, list] = {}
    for c in config_runs:
        p_series[c.label], r_series[c.label] = [], []
        for value in values:
            subset = [r for r in c.runs if category_of(r.query, name) == value]
            m = metrics.aggregate(subset, ks=[SWEEP_K], pool_k=pool_size)
            p_series[c.label].append(m[f"P@{SWEEP_K}"])
            r_series[c.label].append(m[f"R@{SWEEP_K}"])
    counts = [sum(1 for r in config_runs[0].runs if category_of(r.query, name) == v) for v in values] \
        if config_runs else [0] * len(values)
    groups = [f"{v} (n={n})" for v, n in zip(values, counts)]
    width = max(7, 0.6 * len(values) * max(1, len(config_runs)) + 2)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(width, 7), sharex=True)
    _grouped_bars(ax1, groups, p_series, f"P@{SWEEP_K}")
    _grouped_bars(ax2, groups, r_series, f"R@{SWEEP_K}")
    ax1.set_title(f"P@{SWEEP_K} and R@{SWEEP_K} by {name}")
    ax1.legend(fontsize=8)
    return _save(fig, path)


def _html_table(table: tables.Table) -> str:
    header, rows = table
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(path.name)}</figcaption></figure>")


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead { background: #f0f0f0; }
figure { margin: 1em 0; } img { max-width: 100%; }
figcaption { color: #777; font-size: 0.8em; }
.note { color: #555; font-size: 0.9em; }
"""


def write_report(directory: Path, summary: dict, config_runs: Sequence[ConfigRun], source: str = "") -> Path:
    """Write the PNGs and index.html into ``directory`` (created); returns index.html's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    taken: set[str] = {"index"}
    parts: list[str] = []
    title = "Evidentia evaluation"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts.append(f"<h1>{html.escape(title)}</h1>")
    parts.append(f"<p>{summary['queries']} queries{' from ' + html.escape(source) if source else ''}; "
                 f"candidate pool of {summary['pool_size']} pages; configurations: "
                 f"{html.escape(', '.join(summary['configs']))}. Generated {stamp}.</p>")

    parts.append("<h2>Metrics</h2>")
    parts.append(_html_table(tables.main_table(summary)))
    parts.extend(f'<p class="note">{html.escape(n)}</p>' for n in tables.notes(summary))
    parts.append(_img(plot_metrics(summary, directory / f"{_slug('metrics', taken)}.png"), "ranking metrics"))

    prob_passes: dict[str, list[ConfigRun]] = {}
    for c in config_runs:
        if c.probabilistic:
            prob_passes.setdefault(pass_label(c), []).append(c)
    if prob_passes:
        parts.append("<h2>Probability rerankers</h2>")
    for label, runs in prob_passes.items():
        thresholds = sorted({c.config.threshold for c in runs if c.config.threshold is not None})
        sweep = summary["threshold_sweeps"][label]
        parts.append(f"<h3>{html.escape(label)}</h3>")
        if runs[0].model_version:  # the sweep and calibration are this model's, not the reranker's in general
            parts.append(f'<p class="note">model: {html.escape(runs[0].model_version)}</p>')
        parts.append(f"<p>P@{SWEEP_K} and R@{SWEEP_K} when keeping the pages whose probability is at least the "
                     "threshold (dashed lines: the configured thresholds). A threshold that replaces a fixed "
                     f"top-k keeps at least {MIN_RECALL_KEPT:.0%} of the unthresholded R@{SWEEP_K} while returning "
                     f"at most {MAX_POOL_SHARE:.0%} of the pool (last column).</p>")
        parts.append(_img(plot_sweep(label, sweep, thresholds, directory / f"{_slug('threshold-' + label, taken)}.png"),
                          f"{label} threshold sweep"))

        def meets(r: dict) -> str:
            kept, share = r.get(f"R@{SWEEP_K}_kept"), r.get("pool_share")
            return "–" if kept is None or share is None else (
                "yes" if kept >= MIN_RECALL_KEPT and share <= MAX_POOL_SHARE else "no")

        sweep_table = (["threshold", f"P@{SWEEP_K}", f"R@{SWEEP_K}", f"R@{SWEEP_K} kept", "pool share", "pages/query",
                        "both goals"],
                       [[f"{r['threshold']:g}", tables.fmt("", r[f"P@{SWEEP_K}"]),
                         tables.fmt("", r[f"R@{SWEEP_K}"]), tables.fmt("", r.get(f"R@{SWEEP_K}_kept")),
                         tables.fmt("", r.get("pool_share")), tables.fmt("pages_per_query", r["pages_per_query"]),
                         meets(r)]
                        for r in sweep])
        parts.append(_html_table(sweep_table))
        bins = reliability(runs[0])
        ece = summary["configs"][runs[0].label]["ECE"]
        parts.append(_img(plot_reliability(label, bins, ece, directory / f"{_slug('reliability-' + label, taken)}.png"),
                          f"{label} reliability diagram"))

    fields = category_fields([r.query for r in config_runs[0].runs]) if config_runs else {}
    if fields:
        parts.append("<h2>By category</h2>")
    for name, values in fields.items():
        parts.append(f"<h3>{html.escape(name)}</h3>")
        parts.append(_html_table(tables.category_table(summary, name)))
        parts.append(_img(plot_category(name, values, config_runs, summary["pool_size"],
                                        directory / f"{_slug('category-' + name, taken)}.png"),
                          f"P@{SWEEP_K} and R@{SWEEP_K} by {name}"))

    page = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
    index = directory / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
