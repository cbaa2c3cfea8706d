"""Every figure's content lies inside its box: no label, legend or scale cut off by the SVG's edge.

Each element's extent is read from its attributes: rects and lines exactly, circles with their
radius, text from its anchor and a width of FONT_WIDTH per character (a generous estimate for
system-ui at 11 px), rotated text turned about its anchor. A figure whose content reaches past
its width or height (beyond SLACK pixels) fails, naming the element.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from graphaudit.report import svg
from graphaudit.report.html import render_html

from support.report_samples import dense, document, earlyexit, featuregate, mudd

FONT_WIDTH, FONT_HEIGHT, SLACK = 6.0, 11.0, 1.0
NS = "{http://www.w3.org/2000/svg}"


def _boxes(element: ET.Element):
    """(tag, x0, y0, x1, y1, text) of every drawn element in an SVG."""
    for node in element.iter():
        tag = node.tag.removeprefix(NS)
        a = {k: v for k, v in node.attrib.items()}
        if tag == "rect":
            x, y, w, h = (float(a[k]) for k in ("x", "y", "width", "height"))
            yield tag, x, y, x + w, y + h, ""
        elif tag == "line":
            x1, x2, y1, y2 = (float(a[k]) for k in ("x1", "x2", "y1", "y2"))
            yield tag, min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2), ""
        elif tag == "circle":
            cx, cy, r = float(a["cx"]), float(a["cy"]), float(a["r"])
            yield tag, cx - r, cy - r, cx + r, cy + r, ""
        elif tag == "text":
            text = "".join(node.itertext())
            x, y, width = float(a["x"]), float(a["y"]), FONT_WIDTH * len(text)
            anchor = a.get("text-anchor", "start")
            x0 = x - width if anchor == "end" else x - width / 2 if anchor == "middle" else x
            corners = [(x0, y - FONT_HEIGHT * 0.8), (x0 + width, y - FONT_HEIGHT * 0.8), (x0, y), (x0 + width, y)]
            turn = re.match(r"rotate\((-?[\d.]+) (-?[\d.]+) (-?[\d.]+)\)", a.get("transform", ""))
            if turn:
                angle, ox, oy = (float(g) for g in turn.groups())
                c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
                corners = [(ox + (px - ox) * c - (py - oy) * s, oy + (px - ox) * s + (py - oy) * c) for px, py in corners]
            xs, ys = [p[0] for p in corners], [p[1] for p in corners]
            yield tag, min(xs), min(ys), max(xs), max(ys), text


def _outside(figure: str) -> list[str]:
    root = ET.fromstring(figure)
    width, height = float(root.attrib["width"]), float(root.attrib["height"])
    return [f"{tag} {text!r} spans ({x0:.0f}, {y0:.0f})–({x1:.0f}, {y1:.0f}) in a {width:.0f}×{height:.0f} box"
            for tag, x0, y0, x1, y1, text in _boxes(root)
            if x0 < -SLACK or y0 < -SLACK or x1 > width + SLACK or y1 > height + SLACK]


def _figures(html: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", html, flags=re.S)


@pytest.mark.parametrize("rows", [1, 2, 3, 12, 40])
def test_a_heatmap_holds_its_colour_scale_however_few_its_rows(rows):
    figure = svg.heatmap([f"layer {i}" for i in range(rows)], [str(t) for t in range(16)],
                         [[(i + t) / 40 for t in range(16)] for i in range(rows)], title="gate: mean coefficient")
    assert _outside(figure) == []


def test_the_check_sees_a_label_past_the_edge():
    clipped = svg._svg(100, 50, "t", ['<text x="90" y="20">a label far too long</text>'], "test")
    assert _outside(clipped) and "a label far too long" in _outside(clipped)[0]


@pytest.mark.parametrize("sample", [featuregate, mudd, earlyexit, dense])
def test_every_figure_of_a_report_fits_its_box(sample):
    figures = _figures(render_html(document(sample())))
    assert figures
    for figure in figures:
        assert _outside(figure) == [], figure[:200]


def test_long_block_names_and_series_names_stay_inside():
    figure = svg.bars([f"model.decoder.layers.{i}.mixture_of_experts" for i in range(12)],
                      {"model": [float(i) for i in range(12)], "baseline (fixtures/dense)": [1.0] * 12},
                      title="Median time per block (ms)")
    assert _outside(figure) == []


def test_the_page_fits_a_phone_and_shows_code_spans_as_code():
    doc = document(featuregate())
    doc["notes"] = ["blocks found under `blocks` by `torch`; one stray ` backtick"]
    html = render_html(doc)
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    assert "svg.chart{max-width:100%;height:auto}" in html  # figures shrink to the screen's width
    assert '<div class="scroll"><table>' in html  # a wide table scrolls in its own box, not the page
    assert "<code>blocks</code>" in html and "<code>torch</code>" in html
    assert "`" not in html


def test_a_cut_table_cell_never_leaves_a_code_span_open():
    from graphaudit.report.tables import _short

    cut = _short("Gather `node_index_select` picks rows of `view_6` by `val_110` (from NonZero `node_nonzero`)", 72)
    assert len(cut) <= 72 and cut.endswith("…") and cut.count("`") % 2 == 0
    assert _short("plain text that is long enough to be cut somewhere", 20) == "plain text that is …"


def test_blocks_that_ran_shade_a_subset_block_by_the_share_of_its_compute_each_input_ran():
    from graphaudit.report.html import executed_figure

    doc = document(featuregate())
    profile = doc["profile"]
    profile["per_input"] = [
        {"index": 0, "blocks_ran": ["blocks.0", "blocks.1"], "flops": {"blocks.0": 100, "blocks.1": 40}},
        {"index": 1, "blocks_ran": ["blocks.0", "blocks.1"], "flops": {"blocks.0": 100, "blocks.1": 80}},
        {"index": 2, "blocks_ran": ["blocks.0"], "flops": {"blocks.0": 100}},
    ]
    figure, _ = executed_figure(doc)
    shares = dict(re.findall(r"<title>(blocks\.1 · \d): ([\d.]+)</title>", figure))
    assert shares == {"blocks.1 · 0": "0.5", "blocks.1 · 1": "1", "blocks.1 · 2": "0"}  # input 2 ran none of it
    assert re.findall(r"<title>blocks\.0 · \d: ([\d.]+)</title>", figure) == ["1", "1", "1"]


def test_a_table_cell_cut_short_keeps_its_whole_text_as_a_tooltip():
    from graphaudit.report.html import _cell
    from graphaudit.report.tables import Cut, _short

    long = "Gather `node_index_select` picks rows of `view_6` by `val_110` (from NonZero `node_nonzero`) in block 1"
    cut = _short(long, 72)
    assert isinstance(cut, Cut) and cut.full == long and str(cut) == cut  # text and Markdown print it as is
    cell = _cell(cut)
    assert cell.startswith('<td title="Gather node_index_select picks rows of view_6 by val_110 (from NonZero '
                           'node_nonzero) in block 1">') and "<code>node_index_select</code>" in cell
    assert _cell(_short("short enough", 72)) == "<td>short enough</td>"
