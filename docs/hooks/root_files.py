"""MkDocs hook: pages that show a file of the repository root (BENCHMARKS.md, CONTRIBUTING.md) as it is, and
the home page with the README's "The first five things".

Those files stay where readers of the repository look for them, and the site shows the same text. Their
links are written for the repository root (`docs/data.md#choosing-a-padding`); on the site the page sits
inside docs/, so the `docs/` prefix is dropped, and the strict build then checks every such link.
"""

import re
from pathlib import Path

# page under docs/ -> the root file it shows
ROOT_FILES = {"benchmarks.md": "BENCHMARKS.md", "contributing.md": "CONTRIBUTING.md"}
DOCS_LINK = re.compile(r"\]\(docs/")
# page -> {the placeholder line in it: the README section shown there}
README_SECTIONS = {"index.md": {"<!-- README: The first five things -->": "The first five things"}}


def readme_section(readme: str, title: str) -> str:
    """The `## title` section of the README, up to the next `## ` heading, its links made relative to docs/."""
    start = readme.index(f"\n## {title}\n")
    end = readme.find("\n## ", start + 1)
    return DOCS_LINK.sub("](", readme[start : end if end > 0 else None]).strip("\n")


def on_page_markdown(markdown, page, config, files):
    """The root file's text in place of the page's placeholder, its links made relative to docs/; a README
    section in place of its placeholder line."""
    root = Path(config["config_file_path"]).parent
    for placeholder, title in README_SECTIONS.get(page.file.src_uri, {}).items():
        if placeholder not in markdown:
            raise ValueError(f"{page.file.src_uri} lost its placeholder line {placeholder}")
        markdown = markdown.replace(placeholder, readme_section((root / "README.md").read_text(), title))
    name = ROOT_FILES.get(page.file.src_uri)
    if name is None:
        return markdown
    return DOCS_LINK.sub("](", (root / name).read_text())
