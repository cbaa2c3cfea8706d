"""Small inline SVG charts for the HTML report: bars, intervals, stacked shares, heatmaps.

Each function returns one `<svg>` element as a string, drawn from plain lists of numbers,
with a `<title>` for screen readers and browsers' tooltips. No script, no external file.
"""

from __future__ import annotations

import math
from html import escape

PALETTE = ("#3b6fb6", "#e08a2e", "#4f9d69", "#c4504a", "#8a6bb8", "#8c7a5b", "#d17ab0", "#6f7f8f")
FONT = 'font-family="system-ui, sans-serif" font-size="11"'
CHAR_W = 6.0  # a character's width at FONT, generously: what the margins are sized for
LABEL_MOST = 28  # characters of a category label; a longer one keeps its end (a block's number and kind)


def _svg(width: int, height: int, title: str, body: list[str], kind: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{escape(kind)}" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" {FONT}>'
            f"<title>{escape(title)}</title>" + "".join(body) + "</svg>")


def _ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= raw:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _num(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _tail(text: str, most: int) -> str:
    return text if len(text) <= most else "…" + text[-(most - 1):]


def _legend(names: list[str], x: float, y: float) -> list[str]:
    out = []
    for i, name in enumerate(names):
        out.append(f'<rect x="{x}" y="{y + i * 14 - 8}" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>'
                   f'<text x="{x + 14}" y="{y + i * 14 + 1}">{escape(name)}</text>')
    return out


def bars(categories: list[str], series: dict[str, list[float | None]], *, title: str,
         unit: str = "", width: int = 640, height: int = 260,
         errors: dict[str, list[tuple[float, float] | None]] | None = None) -> str:
    """Grouped vertical bars: one group per category, one bar per series (None: no bar)."""
    names = list(series)
    values = [v for s in series.values() for v in s if v is not None]
    tops = values + [hi for e in (errors or {}).values() for pair in e if pair for hi in pair[1:]]
    top = max(tops, default=1.0) or 1.0
    legend = max((len(n) for n in names), default=0) * CHAR_W + 22 if len(names) > 1 else 0
    left, right, top_margin = 60, 12 + math.ceil(max(legend, 110 if legend else 0)), 24
    labels = [_tail(c, LABEL_MOST) for c in categories]  # the full name stays in each bar's tooltip
    longest = max((len(c) for c in labels), default=0) * CHAR_W
    plot_w = width - left - right
    # Labels turn 40° when they would not fit under their group side by side; the figure then
    # grows below, and its left margin holds the first label's reach to the left.
    rotate = longest * 1.03 > plot_w / max(len(categories), 1) * 0.95
    bottom = 34
    if rotate:
        bottom = max(70, math.ceil(16 + longest * math.sin(math.radians(40)) + 6))
        first = plot_w / max(len(categories), 1) * 0.5
        left = max(left, math.ceil(longest * math.cos(math.radians(40)) - first + 14))
        plot_w = width - left - right
        height += bottom - 70
    plot_h = height - top_margin - bottom
    y = lambda v: top_margin + plot_h - plot_h * v / (top * 1.08)  # noqa: E731
    body = [f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>']
    for t in _ticks(0, top * 1.08):
        body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>'
                    f'<text x="{left - 4}" y="{y(t) + 4:.1f}" text-anchor="end">{_num(t)}{escape(unit)}</text>')
    group = plot_w / max(len(categories), 1)
    bar_w = group * 0.8 / max(len(names), 1)
    for ci, cat in enumerate(categories):
        gx = left + ci * group + group * 0.1
        for si, name in enumerate(names):
            v = series[name][ci]
            if v is None:
                continue
            x0 = gx + si * bar_w
            body.append(f'<rect class="bar" x="{x0:.1f}" y="{y(v):.1f}" width="{max(bar_w - 1, 1):.1f}" '
                        f'height="{max(y(0) - y(v), 0):.1f}" fill="{PALETTE[si % len(PALETTE)]}">'
                        f"<title>{escape(cat)} · {escape(name)}: {_num(v)}{escape(unit)}</title></rect>")
            pair = (errors or {}).get(name, [None] * len(categories))[ci]
            if pair:
                cx = x0 + bar_w / 2
                body.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(pair[0]):.1f}" y2="{y(pair[1]):.1f}" '
                            'stroke="#222"/>')
        lx = gx + group * 0.4
        ly = top_margin + plot_h + 12
        label = escape(labels[ci])
        if rotate:
            body.append(f'<text x="{lx:.1f}" y="{ly}" text-anchor="end" transform="rotate(-40 {lx:.1f} {ly})">'
                        f"{label}</text>")
        else:
            body.append(f'<text x="{lx:.1f}" y="{ly + 2}" text-anchor="middle">{label}</text>')
    body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#444"/>')
    if len(names) > 1:
        body += _legend(names, width - right + 8, top_margin + 10)
    return _svg(width, height, title, body, "bars")


def intervals(labels: list[str], values: list[float], lows: list[float | None], highs: list[float | None],
              *, title: str, unit: str = "", width: int = 640) -> str:
    """One row per label: a dot at the value and a whisker over its interval; a line at zero."""
    row_h, left, right, top_margin = 24, 130, 20, 28
    height = top_margin + row_h * len(labels) + 30
    points = [v for v in values] + [v for v in lows + highs if v is not None] + [0.0]
    lo, hi = min(points), max(points)
    pad = (hi - lo) * 0.08 or 1.0
    lo, hi = lo - pad, hi + pad
    plot_w = width - left - right
    x = lambda v: left + plot_w * (v - lo) / (hi - lo)  # noqa: E731
    body = [f'<text x="8" y="14" font-weight="bold">{escape(title)}</text>']
    bottom = top_margin + row_h * len(labels)
    for t in _ticks(lo, hi, 5):
        body.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top_margin}" y2="{bottom}" stroke="#eee"/>'
                    f'<text x="{x(t):.1f}" y="{bottom + 14}" text-anchor="middle">{_num(t)}</text>')
    body.append(f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{top_margin - 4}" y2="{bottom}" stroke="#888" '
                'stroke-dasharray="3,3"/>')
    for i, (label, v, low, high) in enumerate(zip(labels, values, lows, highs)):
        cy = top_margin + row_h * i + row_h / 2
        body.append(f'<text x="{left - 8}" y="{cy + 4:.1f}" text-anchor="end">{escape(label)}</text>')
        if low is not None and high is not None:
            body.append(f'<line x1="{x(low):.1f}" x2="{x(high):.1f}" y1="{cy:.1f}" y2="{cy:.1f}" stroke="#222" '
                        f'stroke-width="2"/><line x1="{x(low):.1f}" x2="{x(low):.1f}" y1="{cy - 5:.1f}" y2="{cy + 5:.1f}" '
                        f'stroke="#222"/><line x1="{x(high):.1f}" x2="{x(high):.1f}" y1="{cy - 5:.1f}" y2="{cy + 5:.1f}" '
                        'stroke="#222"/>')
        ci = f" [{_num(low)}, {_num(high)}]" if low is not None and high is not None else ""
        body.append(f'<circle class="point" cx="{x(v):.1f}" cy="{cy:.1f}" r="4.5" fill="{PALETTE[0]}">'
                    f"<title>{escape(label)}: {_num(v)}{escape(unit)}{ci}</title></circle>")
    return _svg(width, height + 4, title, body, "intervals")


def shares(labels: list[str], parts: dict[str, list[float | None]], *, title: str,
           markers: list[float | None] | None = None, marker_name: str = "", width: int = 640) -> str:
    """One horizontal bar per label split into parts summing to at most 1; optional marker line."""
    row_h, left, right, top_margin = 26, 110, 130, 28
    height = top_margin + row_h * len(labels) + 30
    plot_w = width - left - right
    names = list(parts)
    body = [f'<text x="8" y="14" font-weight="bold">{escape(title)}</text>']
    bottom = top_margin + row_h * len(labels)
    for t in (0, 0.25, 0.5, 0.75, 1.0):
        tx = left + plot_w * t
        body.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{top_margin}" y2="{bottom}" stroke="#eee"/>'
                    f'<text x="{tx:.1f}" y="{bottom + 14}" text-anchor="middle">{t * 100:.0f}%</text>')
    for i, label in enumerate(labels):
        y0 = top_margin + row_h * i + 4
        body.append(f'<text x="{left - 8}" y="{y0 + 13}" text-anchor="end">{escape(label)}</text>')
        acc = 0.0
        for pi, name in enumerate(names):
            v = parts[name][i]
            if v is None or v <= 0:
                continue
            v = min(v, 1.0 - acc)
            body.append(f'<rect class="bar" x="{left + plot_w * acc:.1f}" y="{y0}" width="{plot_w * v:.1f}" '
                        f'height="{row_h - 8}" fill="{PALETTE[pi % len(PALETTE)]}">'
                        f"<title>{escape(label)} · {escape(name)}: {v * 100:.1f}%</title></rect>")
            acc += v
        m = (markers or [None] * len(labels))[i]
        if m is not None:
            mx = left + plot_w * m
            body.append(f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{y0 - 3}" y2="{y0 + row_h - 5}" stroke="#000" '
                        f'stroke-width="2"><title>{escape(marker_name)}: {m * 100:.1f}%</title></line>')
    body += _legend(names, width - right + 24, top_margin + 10)
    if marker_name and markers:
        ly = top_margin + 10 + len(names) * 14
        body.append(f'<line x1="{width - right + 29}" x2="{width - right + 29}" y1="{ly - 9}" y2="{ly + 2}" '
                    f'stroke="#000" stroke-width="2"/><text x="{width - right + 38}" y="{ly + 1}">'
                    f"{escape(marker_name)}</text>")
    return _svg(width, height, title, body, "shares")


def heatmap(rows: list[str], columns: list[str], values: list[list[float | None]], *, title: str,
            width: int = 640, low: float | None = None, high: float | None = None) -> str:
    """A grid of cells shaded from light (low) to dark (high); None cells are left blank."""
    flat = [v for r in values for v in r if v is not None]
    lo = min(flat, default=0.0) if low is None else low
    hi = max(flat, default=1.0) if high is None else high
    span = (hi - lo) or 1.0
    left, right, top_margin = 90, 70, 26
    n_cols = max(len(columns), 1)
    cell_w = (width - left - right) / n_cols
    cell_h = max(10.0, min(22.0, 260 / max(len(rows), 1)))
    scale = 10 * 10 + 14  # the colour scale beside the grid: ten steps and the low end's label
    height = int(top_margin + max(cell_h * len(rows) + 34, scale))
    body = [f'<text x="8" y="14" font-weight="bold">{escape(title)}</text>']
    for ri, (row, line) in enumerate(zip(rows, values)):
        y0 = top_margin + ri * cell_h
        body.append(f'<text x="{left - 6}" y="{y0 + cell_h / 2 + 4:.1f}" text-anchor="end">{escape(row)}</text>')
        for ci, v in enumerate(line):
            if v is None:
                continue
            t = (v - lo) / span
            body.append(f'<rect class="cell" x="{left + ci * cell_w:.1f}" y="{y0:.1f}" width="{cell_w + 0.3:.1f}" '
                        f'height="{cell_h + 0.3:.1f}" fill="{_shade(t)}"><title>{escape(row)} · '
                        f"{escape(columns[ci] if ci < len(columns) else str(ci))}: {_num(v)}</title></rect>")
    step = max(1, math.ceil(n_cols / 16))
    bottom = top_margin + cell_h * len(rows)
    for ci in range(0, n_cols, step):
        body.append(f'<text x="{left + (ci + 0.5) * cell_w:.1f}" y="{bottom + 13:.1f}" text-anchor="middle">'
                    f"{escape(columns[ci])}</text>")
    lx = width - right + 12
    for k in range(10):
        body.append(f'<rect x="{lx}" y="{top_margin + k * 10}" width="12" height="10" fill="{_shade(1 - k / 9)}"/>')
    body.append(f'<text x="{lx + 16}" y="{top_margin + 9}">{_num(hi)}</text>'
                f'<text x="{lx + 16}" y="{top_margin + 100}">{_num(lo)}</text>')
    return _svg(width, height, title, body, "heatmap")


def _shade(t: float) -> str:
    t = min(max(t, 0.0), 1.0)
    a, b = (0xf4, 0xf7, 0xfb), (0x1d, 0x4e, 0x89)
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b))
