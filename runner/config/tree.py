"""The one walk over a configuration tree (plain dicts and lists, as `OmegaConf.to_container` gives them)."""

from typing import Any, Dict, Iterator, Tuple


def walk(node: Any, path: str = "") -> Iterator[Tuple[str, Any, Any]]:
    """(dotted path, key, value) of every entry below node, depth first: a dict or list is yielded
    itself, then entered. Dict entries are `a.b`, list items `a[0]` (their key is the index)."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            yield where, key, value
            yield from walk(value, where)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            where = f"{path}[{i}]"
            yield where, i, value
            yield from walk(value, where)


def flat(node: Dict[str, Any]) -> Dict[str, Any]:
    """{dotted key: value} of every setting: nested dicts are entered, a list is one value.

    An empty dict is a value too (`{}`), so that a section that gained or lost all its keys still
    shows as a difference when two configs are compared."""
    out: Dict[str, Any] = {}

    def visit(d: Dict[str, Any], prefix: str) -> None:
        for key, value in d.items():
            where = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                visit(value, where + ".")
            else:
                out[where] = value

    visit(node, "")
    return out
