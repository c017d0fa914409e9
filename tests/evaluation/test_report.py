"""The report's plots: labels placed where they cover nothing (evaluation/report.py)."""

from __future__ import annotations

import pytest

from evidentia.evaluation.metrics import ReliabilityBin
from evidentia.evaluation.report import _crosses, reliability_figure, sweep_figure

SWEEP = [{"threshold": round(0.05 * i, 2), "P@3": 0.3 - 0.01 * i, "R@3": 0.8 - 0.02 * i,
          "pages_per_query": 16 - 0.8 * i} for i in range(19)]


def drawn(fig):
    """The figure as it is saved (report._save): laid out, then drawn."""
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    return renderer


def overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("thresholds", [[0.1], [0.1, 0.125, 0.15, 0.5]])
def test_threshold_labels_sit_above_the_top_border_and_below_the_title(thresholds):
    """The label "0.1" was drawn at y 1.02 of an axes ending at 1.05: across its top border."""
    fig = sweep_figure("bm25+classifier", SWEEP, thresholds)
    renderer = drawn(fig)
    ax = fig.axes[0]
    frame = ax.get_window_extent(renderer)
    title = ax.title.get_window_extent(renderer)
    labels = [t for t in ax.texts if t.get_text() in {f"{x:g}" for x in thresholds}]
    assert sorted(t.get_text() for t in labels) == sorted(f"{x:g}" for x in thresholds)
    boxes = [t.get_window_extent(renderer) for t in labels]
    for box in boxes:
        assert box.y0 >= frame.y1  # above the border, not across it
        assert box.y1 <= title.y0  # and under the title
    assert not any(overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def bins(points):
    """Reliability bins with (mean probability, observed frequency, count)."""
    return [ReliabilityBin(i / 10, (i + 1) / 10, n, p, f) for i, (p, f, n) in enumerate(points)]


@pytest.mark.parametrize("points", [
    # most pages in the first bin, the curve rising from it: its "n=134" sat on the curve and the point
    [(0.03, 0.02, 134), (0.15, 0.08, 40), (0.25, 0.12, 21), (0.35, 0.3, 9), (0.45, 0.5, 6), (0.55, 0.5, 4),
     (0.65, 0.7, 3), (0.75, 0.6, 5), (0.85, 0.9, 2), (0.95, 1.0, 4)],
    # a falling curve, and a point in the top corner
    [(0.04, 0.3, 93), (0.14, 0.1, 27), (0.26, 0.0, 18), (0.36, 0.0, 4), (0.44, 0.0, 7), (0.55, 0.0, 2),
     (0.63, 0.33, 3), (0.75, 0.0, 0), (0.87, 0.0, 3), (0.93, 1.0, 4)],
])
def test_reliability_counts_cover_no_point_no_curve_and_stay_inside(points):
    fig = reliability_figure("bm25+classifier", bins(points), 0.05)
    renderer = drawn(fig)
    ax = fig.axes[0]
    frame = ax.get_window_extent(renderer)
    labels = [t for t in ax.texts if t.get_text().startswith("n=")]
    assert len(labels) == sum(1 for _, _, n in points if n)
    curve = ax.get_lines()[1]
    xy = ax.transData.transform(curve.get_xydata())
    radius = curve.get_markersize() / 2 * fig.dpi / 72
    segments = [(xy[i], xy[i + 1]) for i in range(len(xy) - 1)]
    boxes = [t.get_window_extent(renderer) for t in labels]
    for text, box in zip(labels, boxes):
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, text
        for x, y in xy:  # no marker under a label (its box grown by the marker's radius)
            assert not (box.x0 - radius < x < box.x1 + radius and box.y0 - radius < y < box.y1 + radius), text
        assert not any(_crosses(box, p, q) for p, q in segments), text
    assert not any(overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    # the bar counts below fit under the top border too
    axc = fig.axes[1]
    top = axc.get_window_extent(renderer).y1
    assert all(t.get_window_extent(renderer).y1 <= top for t in axc.texts)


def test_crosses():
    from matplotlib.transforms import Bbox

    box = Bbox([[0, 0], [10, 10]])
    assert _crosses(box, (-5, 5), (15, 5)) and _crosses(box, (5, 5), (6, 6)) and _crosses(box, (-5, -5), (15, 15))
    assert not _crosses(box, (-5, 11), (15, 11)) and not _crosses(box, (11, -5), (30, 20))
