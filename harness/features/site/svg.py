"""Trends as inline SVG, drawn here in Python: a sparkline in a matrix cell, a chart on a record's page.

The y axis is the share of proving verdicts that passed (0..1); each point is one record behind the
cell, oldest first, coloured by what it says now. A record with nothing counted (refused, not judged,
stale) sits on the floor as a hollow mark. No script is needed to see them, and nothing is fetched.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from harness.features.site.data import Point

COLOUR = {"pass": "#1a7f37", "partial": "#bf8700", "fail": "#cf222e", "vacuous": "#8250df",
          "refused": "#9a6700", "stale": "#8c959f", "todo": "#8c959f", "na": "#d0d7de"}


def _xy(points: Sequence[Point], w: float, h: float, pad: float) -> list[tuple[float, float]]:
    n = len(points)
    step = (w - 2 * pad) / (n - 1) if n > 1 else 0.0
    out = []
    for i, p in enumerate(points):
        x = pad + i * step if n > 1 else w / 2
        r = p.rate
        out.append((x, h - pad - (r if r is not None else 0.0) * (h - 2 * pad)))
    return out


def _marks(points: Sequence[Point], xy: Sequence[tuple[float, float]], r: float, titles: bool) -> str:
    out = []
    for p, (x, y) in zip(points, xy, strict=True):
        c = COLOUR.get(p.state, "#57606a")
        fill = c if p.rate is not None else "none"
        tip = f"<title>{escape(p.sha[:10] or 'no SHA')} {p.state} {p.count}</title>" if titles else ""
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}" stroke="{c}">{tip}</circle>')
    return "".join(out)


def sparkline(points: Sequence[Point], w: int = 64, h: int = 16) -> str:
    """A cell's trend, small: one mark per record, joined by a line."""
    if not points:
        return ""
    xy = _xy(points, w, h, 3)
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    return (f'<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
            f'aria-label="trend over {len(points)} records">'
            f'<polyline points="{line}" fill="none" stroke="#8c959f" stroke-width="1"/>'
            f"{_marks(points, xy, 1.8, False)}</svg>")


def chart(points: Sequence[Point], w: int = 640, h: int = 180) -> str:
    """A cell's trend on its record's page: pass share per record, labelled with each SHA."""
    if not points:
        return ""
    pad, left, bottom = 12, 40, 34
    n = len(points)
    step = (w - left - pad) / (n - 1) if n > 1 else 0.0
    xy = []
    for i, p in enumerate(points):
        x = left + i * step if n > 1 else (w + left) / 2
        r = p.rate if p.rate is not None else 0.0
        xy.append((x, pad + (1 - r) * (h - pad - bottom)))
    grid = []
    for v in (0.0, 0.5, 1.0):
        y = pad + (1 - v) * (h - pad - bottom)
        grid.append(f'<line x1="{left}" x2="{w - pad}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d0d7de"/>'
                    f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v:.0%}</text>')
    labels = "".join(f'<text x="{x:.1f}" y="{h - bottom + 16}" text-anchor="middle">'
                     f"{escape(p.sha[:7] or '—')}</text>"
                     for i, (p, (x, _y)) in enumerate(zip(points, xy, strict=True))
                     if n <= 12 or i % max(1, n // 12) == 0 or i == n - 1)
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    return (f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
            f'aria-label="pass share over {n} records">{"".join(grid)}'
            f'<polyline points="{line}" fill="none" stroke="#57606a" stroke-width="1.5"/>'
            f"{_marks(points, xy, 4, True)}{labels}</svg>")
