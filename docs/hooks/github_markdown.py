"""MkDocs hook: the pages are written for GitHub's Markdown too, and one rule differs in Python-Markdown.

In a table row GitHub splits cells at every `|`, also inside a code span, so a pipe in code is written `\\|`
(`amp.loss_scale.type=none\\|fixed\\|dynamic`); GitHub drops the backslash. Python-Markdown's tables never split
inside a code span and keep the backslash, so the site showed a literal `\\|` (20 on the configuration page).
The code spans of table rows lose it here, before Python-Markdown reads the page; GitHub reads the file as written.
"""

import re

CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def unescape_table_pipes(markdown: str) -> str:
    """`\\|` as `|` inside the code spans of table rows (lines that start with `|`), outside fenced code blocks."""
    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|"):
            line = CODE_SPAN.sub(lambda m: m.group(1) + m.group(2).replace("\\|", "|") + m.group(1), line)
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    """Every page, root files included (this hook runs after root_files.py fills theirs in)."""
    return unescape_table_pipes(markdown)
