"""MkDocs hook: pages that show a file of the repository root (BENCHMARKS.md, CONTRIBUTING.md) as it is.

Those files stay where readers of the repository look for them, and the site shows the same text. Their
links are written for the repository root (`docs/data.md#choosing-a-padding`); on the site the page sits
inside docs/, so the `docs/` prefix is dropped, and the strict build then checks every such link.
"""

import re
from pathlib import Path

# page under docs/ -> the root file it shows
ROOT_FILES = {"benchmarks.md": "BENCHMARKS.md", "contributing.md": "CONTRIBUTING.md"}
DOCS_LINK = re.compile(r"\]\(docs/")


def on_page_markdown(markdown, page, config, files):
    """The root file's text in place of the page's placeholder, its links made relative to docs/."""
    name = ROOT_FILES.get(page.file.src_uri)
    if name is None:
        return markdown
    root = Path(config["config_file_path"]).parent
    return DOCS_LINK.sub("](", (root / name).read_text())
