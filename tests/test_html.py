"""The HTML report: one self-contained page whose figures a real browser shows.

The browser test needs Chromium (or Chrome) and is skipped, saying so, where none is
installed: `apt-get install chromium` on Debian, or set GRAPHAUDIT_BROWSER to a binary.
"""

import os
import re
import shutil
import subprocess

import pytest

from graphaudit.report import render

from support.report_samples import dense, document, earlyexit, featuregate, mudd

FIGURES = ("coefficient-means", "variance-shares", "delta-nll", "latency", "executed")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_browser():
    named = os.environ.get("GRAPHAUDIT_BROWSER")
    if named:
        return shutil.which(named) or (named if os.path.isfile(named) else None)
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def figures(page: str) -> dict[str, int]:
    """figure id -> number of <svg> elements inside it."""
    out = {}
    for ident, body in re.findall(r'<figure id="([\w-]+)"[^>]*>(.*?)</figure>', page, re.S):
        out[ident] = len(re.findall(r"<svg\b", body))
    return out


def test_page_is_self_contained_with_every_figure():
    page = render(document(earlyexit()), "html")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "the page must load nothing"
    counts = figures(page)
    assert set(counts) == set(FIGURES)
    assert all(counts[f] >= 1 for f in FIGURES), counts
    assert counts["latency"] == 2  # per block, and whole model against the baseline
    assert page.count('class="point"') == 5  # one ΔNLL interval per non-correct condition


def test_per_block_latency_sets_the_baselines_blocks_beside_the_models_with_both_spreads():
    page = render(document(featuregate()), "html")
    latency = re.search(r'<figure id="latency"[^>]*>(.*?)</figure>', page, re.S).group(1)
    per_block = re.findall(r"<svg\b.*?</svg>", latency, re.S)[0]
    assert "p10–p90 over inputs" in per_block
    assert per_block.count('class="bar"') == 8  # 4 blocks, model and baseline
    assert per_block.count('stroke="#222"') == 8  # a p10–p90 line on every bar
    assert "blocks.0 · baseline: 0.3" in per_block and "blocks.0 · model: 0.4" in per_block


def test_missing_measurements_are_said_not_drawn():
    page = render(document(dense()), "html")
    counts = figures(page)
    for ident in ("coefficient-means", "variance-shares", "delta-nll"):
        assert counts[ident] == 0
    assert "Not shown: no coefficients were captured." in page
    assert "Not shown: no frozen replay ran." in page
    assert counts["latency"] >= 1 and counts["executed"] == 1


def test_text_is_escaped():
    doc = document(featuregate(), model="<b>evil</b>.onnx")
    page = render(doc, "html")
    assert "<b>evil</b>" not in page and "&lt;b&gt;evil&lt;/b&gt;" in page


# Run in the page by the browser test only (the report itself has no script): every drawn element
# of every figure inside its figure's box, as the browser laid it out; no sideways scroll; no
# resource fetched; the findings written into the DOM for --dump-dom to bring back.
CHECK = """<script>
const clipped = [];
for (const chart of document.querySelectorAll("svg.chart")) {
  const box = chart.getBoundingClientRect();
  for (const el of chart.querySelectorAll("rect, line, circle, text")) {
    const r = el.getBoundingClientRect();
    if (r.left < box.left - 1 || r.top < box.top - 1 || r.right > box.right + 1 || r.bottom > box.bottom + 1)
      clipped.push(chart.dataset.chart + ": " + el.tagName + " " + (el.textContent || "").slice(0, 40));
  }
}
const result = {clipped: clipped, scroll: document.documentElement.scrollWidth - window.innerWidth,
                resources: performance.getEntriesByType("resource").map(e => e.name)};
document.body.setAttribute("data-check", JSON.stringify(result));
</script>"""


def _browse(browser, tmp_path, page: str, width: int) -> tuple[dict, str]:
    """What the browser found in `page` at `width` CSS pixels, and its log; a screenshot beside."""
    import json
    from html import unescape

    path = tmp_path / f"report-{width}.html"
    path.write_text(page.replace("</body>", CHECK + "</body>"), encoding="utf-8")
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
               f"--window-size={width},2400", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000"]
    dom = subprocess.run(command + ["--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-check="([^"]*)"', dom.stdout)
    assert found, "the browser ran no check (is JavaScript off?)"
    shot = tmp_path / f"report-{width}.png"
    subprocess.run(command + [f"--screenshot={shot}", path.as_uri()], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 20_000  # a page with figures, not a blank one
    return json.loads(unescape(found.group(1))), dom.stderr


@pytest.mark.parametrize("sample", [featuregate, mudd, earlyexit, dense], ids=lambda f: f.__name__)
@pytest.mark.parametrize("width", [1100, 420])
def test_a_browser_shows_every_report_unclipped_loading_nothing_and_without_errors(tmp_path, sample, width):
    browser = find_browser()
    if browser is None:
        pytest.skip("no headless browser found (install Chromium, e.g. `apt-get install chromium`, "
                    "or set GRAPHAUDIT_BROWSER)")
    check, log = _browse(browser, tmp_path, render(document(sample()), "html"), width)
    assert check["clipped"] == [], check["clipped"][:5]
    assert check["scroll"] <= 0, f"the page scrolls sideways by {check['scroll']} px at {width} px"
    assert check["resources"] == []
    console = [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console


def test_browser_shows_every_figure(tmp_path):
    browser = find_browser()
    if browser is None:
        pytest.skip("no headless browser found (install Chromium, e.g. `apt-get install chromium`, "
                    "or set GRAPHAUDIT_BROWSER)")
    path = tmp_path / "report.html"
    path.write_text(render(document(mudd()), "html"), encoding="utf-8")
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(command + ["--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    counts = figures(dom.stdout)
    assert set(counts) == set(FIGURES)
    assert all(counts[f] >= 1 for f in FIGURES), counts
    # The browser parsed the SVG as SVG: its shapes are in the DOM it built.
    assert dom.stdout.count("<rect") > 20 and dom.stdout.count("<circle") == 5
    shot = tmp_path / "report.png"
    subprocess.run(command + ["--window-size=1100,2400", f"--screenshot={shot}", path.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 20_000  # a page with figures, not a blank one
