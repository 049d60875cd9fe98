"""The documentation site as a reader sees it: built with MkDocs (what `make docs` runs), its HTML checked for what
Material and Python-Markdown got wrong (a literal `\\|` in tables, code without highlighting, the home page without
the README's first five things), then laid out at 1280 px in a real browser when Chromium is installed: a text
column wide enough for the code blocks, no code block cut off, no word broken inside a table cell."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from docs_pages import REPO, nav_pages

# The pages the browser checks: the home page, the widest tables, the longest code lines.
BROWSER_PAGES = ["index.html", "configuration/index.html", "using-a-trained-model/index.html", "launchers/index.html"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    from test_docs import build

    out = tmp_path_factory.mktemp("site")
    build(REPO / "mkdocs.yml", out)
    return out


def pages(site: Path) -> dict:
    return {str(p.relative_to(site)): p.read_text() for p in site.rglob("index.html")}


def test_no_literal_backslash_pipe_on_any_page(site):
    # GitHub wants `\|` for a pipe inside a table's code span; Python-Markdown showed it as written
    # (docs/hooks/github_markdown.py). Pipes stay: `amp.loss_scale.type=none|fixed|dynamic`.
    found = {name: html.count("\\|") for name, html in pages(site).items() if "\\|" in html}
    assert not found, found
    assert "amp.loss_scale.type=none|fixed|dynamic" in (site / "configuration/index.html").read_text()


def test_every_code_block_is_highlighted(site):
    plain, blocks = [], 0
    for name, html in pages(site).items():
        for m in re.finditer(r"<pre\b", html):
            blocks += 1
            opening = html.rfind("<div", 0, m.start())
            if not re.match(r'<div class="language-[a-z]+ highlight">', html[opening:]):
                plain.append(f"{name}: {html[m.start() : m.start() + 80]!r}")
        # A `$ ` session names its prompt; Pygments colours it apart from the command and the output.
        for session in re.findall(r'<div class="language-console highlight">(.*?)</pre>', html, re.S):
            assert '<span class="gp">$ </span>' in session, (name, session[:200])
    assert blocks > 50 and not plain, plain
    assert 'class="c1"' in (site / "index.html").read_text() or 'class="c"' in (site / "index.html").read_text()


def test_the_home_page_has_the_readmes_first_five_things(site):
    home = (site / "index.html").read_text()
    for lead in ("Train.", "Sweep.", "Resume.", "Evaluate, predict, export.", "Fine-tune."):
        assert f"<strong>{lead}</strong>" in home, lead
    assert "runner.export" in home and 'href="configuration/"' in home  # links made relative to docs/
    assert {f"{p[: -len('.md')]}/index.html" for p in nav_pages() if p != "index.md"} <= set(pages(site))


PROBE = """<script>
(function () {
  const out = {};
  const main = document.querySelector(".md-content");
  out.column = main.getBoundingClientRect().width;
  out.cut = [...document.querySelectorAll(".md-typeset pre > code")]
    .filter((code) => code.scrollWidth > code.clientWidth + 1)
    .map((code) => code.textContent.slice(0, 60));
  out.broken = [];
  for (const cell of document.querySelectorAll(".md-typeset table td, .md-typeset table th")) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/[A-Za-z0-9_]{2,}/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
        if (tops.size > 1) out.broken.push(m[0]);
      }
    }
  }
  const probe = document.createElement("pre");
  probe.id = "layout-probe";
  probe.textContent = JSON.stringify(out);
  document.body.appendChild(probe);
})();
</script>"""


def chromium(*args, timeout=120) -> subprocess.CompletedProcess:
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    return subprocess.run([*base, "--hide-scrollbars", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # ~10 s: Chromium lays out four pages and takes a screenshot
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium to lay the pages out (apt-get install chromium)")
def test_at_1280_px_code_fits_the_column_and_no_table_word_is_broken(site, tmp_path):
    for name in BROWSER_PAGES:
        page = site / name
        probed = page.with_name("probed.html")
        probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
        dom = chromium("--window-size=1280,1000", "--dump-dom", probed.as_uri()).stdout
        found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom, re.S)
        assert found, (name, dom[-500:])
        probe = json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
        # The text column had ~690 px of a 1280 px window, a third of it empty beside the table of contents.
        assert probe["column"] >= 900, (name, probe["column"])
        assert not probe["cut"], (name, probe["cut"])  # a code block scrolled out of sight at the right
        assert not probe["broken"], (name, probe["broken"])  # "distribute d", "en vironment"
    # A screenshot, as a reader's window shows the configuration page: the code blocks' grey reaches the right
    # part of the window (it stopped at ~985 px beside the empty table-of-contents column).
    from PIL import Image

    shot = tmp_path / "configuration.png"
    chromium("--window-size=1280,2400", f"--screenshot={shot}", (site / "configuration/index.html").as_uri())
    image = Image.open(shot).convert("RGB")
    grey = [
        x for x in range(image.width) for y in range(0, image.height, 8) if image.getpixel((x, y)) == (245, 245, 245)
    ]
    assert grey and max(grey) > 0.9 * image.width, max(grey, default=None)
