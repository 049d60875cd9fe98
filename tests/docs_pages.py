"""The documentation as the tests read it: README.md, and the site's pages under docs/ in mkdocs.yml's nav order.

The tests that run the documentation's commands and check its numbers find their text here, by page and
section, so a section that moves to another page moves in one place.
"""

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
# Pages that show a file of the repository root (docs/hooks/root_files.py): their text is that file's.
ROOT_FILES = {"benchmarks.md": "BENCHMARKS.md", "contributing.md": "CONTRIBUTING.md"}


def nav_pages() -> list:
    """The pages mkdocs.yml's nav names, in its order, as paths relative to docs/."""
    found = []

    def walk(entry):
        if isinstance(entry, str):
            found.append(entry)
        elif isinstance(entry, list):
            for item in entry:
                walk(item)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)

    walk(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    return [p for p in found if not re.match(r"[a-z]+://", p)]


def page(name: str) -> str:
    """The Markdown of docs/<name> as the site shows it (a root file's text for benchmarks.md, contributing.md)."""
    return (REPO / ROOT_FILES[name] if name in ROOT_FILES else DOCS / name).read_text()


def section(name: str, title: str) -> str:
    """The `## title` section of a page, up to the next `## ` heading."""
    text = page(name)
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def user_docs() -> list:
    """(name, text) of README.md and every page of the nav, in order: where a reader finds commands to copy."""
    return [("README.md", (REPO / "README.md").read_text())] + [
        (name, page(name)) for name in nav_pages() if name not in ROOT_FILES
    ]
