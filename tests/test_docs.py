"""The documentation stays whole: every page is in the site's nav, every link of the README and the root files
resolves, and the site builds with MkDocs' strict mode, which fails on a broken link or anchor."""

import re
import shutil
from pathlib import Path

import pytest
from docs_pages import DOCS, REPO, ROOT_FILES, nav_pages

# [text](target) outside code; images too. Autolinks and reference-style links are not used in these files.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where a `[x](y)` is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set:
    """The ids MkDocs gives the headings of a Markdown file (Python-Markdown's toc, as the site's config uses it)."""
    import markdown

    md = markdown.Markdown(extensions=["toc", "fenced_code", "tables"])
    md.convert(path.read_text())
    found = set()

    def walk(tokens):
        for token in tokens:
            found.add(token["id"])
            walk(token["children"])

    walk(md.toc_tokens)
    return found


def broken_links(source: Path, root: Path = REPO) -> list:
    """The relative links of a Markdown file whose file or heading does not exist, each named from root."""
    broken = []
    for target in LINK.findall(prose(source.read_text())):
        if re.match(r"[a-z]+:", target):  # http(s)://, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (source.parent / path).resolve() if path else source
        if not resolved.exists():
            broken.append(f"{source.relative_to(root)}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{source.relative_to(root)}: {target} (no such heading)")
    return broken


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    nav = nav_pages()
    assert len(nav) == len(set(nav)), [p for p in nav if nav.count(p) > 1]
    assert not pages - set(nav), f"pages under docs/ missing from mkdocs.yml's nav: {sorted(pages - set(nav))}"
    assert not set(nav) - pages, f"mkdocs.yml's nav names pages that do not exist: {sorted(set(nav) - pages)}"


def test_links_of_the_readme_and_the_root_files_resolve():
    # The site's strict build checks the pages' links; these files are read on their own (a repository's
    # front page), so their links are checked here, headings included.
    sources = [REPO / "README.md", *(REPO / name for name in ROOT_FILES.values())]
    assert not [b for source in sources for b in broken_links(source)]
    # The README links every page of the site, so a reader who starts there can reach each one.
    readme = {t.split("#")[0] for t in LINK.findall(prose((REPO / "README.md").read_text()))}
    unlinked = [p for p in nav_pages() if p not in ("index.md", *ROOT_FILES) and f"docs/{p}" not in readme]
    assert not unlinked, f"pages the README's Documentation table does not link: {unlinked}"


def test_the_link_check_finds_a_broken_file_and_a_broken_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A heading\n")
    page.write_text(
        "[ok](other.md#a-heading) [gone](missing.md) [no heading](other.md#nope) `[code](x.md)`\n"
        "```\n[in a block](y.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == [
        "page.md: missing.md (no such file)",
        "page.md: other.md#nope (no such heading)",
    ]


def build(config_file: Path, site_dir: Path) -> None:
    """MkDocs' `build --strict` in this process (what `make docs` runs)."""
    from mkdocs.commands.build import build as mkdocs_build
    from mkdocs.config import load_config

    mkdocs_build(load_config(str(config_file), strict=True, site_dir=str(site_dir)))


@pytest.mark.slow
def test_the_site_builds_strictly_and_a_broken_link_fails_it(tmp_path):
    from mkdocs.exceptions import Abort

    build(REPO / "mkdocs.yml", tmp_path / "site")
    built = {str(p.relative_to(tmp_path / "site")) for p in (tmp_path / "site").rglob("index.html")}
    assert {"index.html", *(f"{p[: -len('.md')]}/index.html" for p in nav_pages() if p != "index.md")} <= built
    # The root files are shown whole, their links made relative to docs/ (docs/hooks/root_files.py).
    assert "CPU ISA cap on and off" in (tmp_path / "site/benchmarks/index.html").read_text()

    # The same site with one broken link in one page: strict mode refuses it.
    copy = tmp_path / "copy"
    shutil.copytree(DOCS, copy / "docs")
    for name in ("mkdocs.yml", "README.md", *ROOT_FILES.values()):  # README.md: the home page's first five things
        shutil.copy(REPO / name, copy / name)
    models = copy / "docs" / "models.md"
    models.write_text(models.read_text() + "\n[the data page](data.md#no-such-heading)\n")
    with pytest.raises(Abort, match="warnings in strict mode"):
        build(copy / "mkdocs.yml", tmp_path / "site2")
