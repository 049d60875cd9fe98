"""A config choice's options declared once: name -> (settings dataclass, builder, summary).

The schema (the choice's enum and the fields its section holds), the checks of fields an option does not
read (checks.py USES), the builder dispatch and the docs' tables all read a registry of these, so adding an
optimizer or a schedule is one YAML and one registration (CONTRIBUTING.md). An installed package adds its
own through an entry point (`runner.optimizers`, `runner.schedules`) naming an `Option`: installed code is
trusted (docs/security.md), a config file never names a builder.

Nothing here imports MindSpore: a builder is a "module:function" name, imported when a run builds it, so a
misspelt option still fails while Hydra composes, before anything heavy loads.
"""

import dataclasses
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from runner.errors import UserError


@dataclass(frozen=True)
class Option:
    """One option of a choice: the fields of its section it reads (a dataclass, with their defaults), the
    "module:function" that builds it, and one line for the docs' table."""

    name: str
    settings: type
    builder: str
    summary: str
    # A package's option has no YAML in conf/: the values its config group file would hold (optimizers only).
    defaults: Dict[str, object] = field(default_factory=dict)


class Options:
    """The options of one choice (`optim.name`, `optim.schedule`), built-in ones first, then installed ones."""

    def __init__(self, key: str, group: str):
        self.key, self.group = key, group  # the choice's config key, the entry-point group of packages' options
        self._options: Dict[str, Option] = {}
        self._fields: Dict[str, dataclasses.Field] = {}
        self.broken: Dict[str, str] = {}  # an installed option that failed to load: why
        self.installed: List[str] = []  # the options installed packages added

    def register(self, option: Option) -> None:
        """Add `option`; a field it shares with another option must have the same type and default."""
        if not option.name.isidentifier() or option.name in self._options:
            raise ValueError(f"{self.key}={option.name}: not a name, or registered twice")
        if not is_dataclass(option.settings) or ":" not in option.builder:
            raise ValueError(f"{self.key}={option.name}: settings must be a dataclass, builder 'module:function'")
        for f in fields(option.settings):
            known = self._fields.get(f.name)
            if known is not None and (known.type, _default(known)) != (f.type, _default(f)):
                raise ValueError(
                    f"{self.key}={option.name} declares {f.name}: {f.type} = {_default(f)!r}, another option "
                    f"{known.type} = {_default(known)!r}: one field of a section has one type and default"
                )
            self._fields.setdefault(f.name, f)
        self._options[option.name] = option

    def load_installed(self) -> None:
        """Register the options installed packages name in this registry's entry-point group. One that fails
        to load is left out with one warning line, the runner's own options still working."""
        for ep in entry_points(group=self.group):
            try:
                option = ep.load()
                if not isinstance(option, Option) or option.name != ep.name:
                    raise ValueError(f"names {option!r}, not an Option called {ep.name!r}")
                self.register(option)
                self.installed.append(option.name)
            except Exception as e:  # a package's bug: said, not a traceback before every command
                self.broken[ep.name] = f"the entry point {ep.value} ({self.group}) failed to load: {e}"
                print(f"warning: {self.key}={ep.name} left out: {self.broken[ep.name]}", file=sys.stderr)

    def installed_sources(self) -> List[Path]:
        """The source of the packages whose builders installed options name (a package folder, or a module's
        file): they build graphs, so the compile cache's key reads them as it reads the runner's own."""
        found = []
        for name in self.installed:
            top = self._options[name].builder.partition(":")[0].partition(".")[0]
            spec = importlib.util.find_spec(top)
            if spec is not None and spec.submodule_search_locations:
                found += [Path(p) for p in spec.submodule_search_locations]
            elif spec is not None and spec.origin:
                found.append(Path(spec.origin))
        return sorted(set(found))

    def names(self) -> List[str]:
        return list(self._options)

    def __getitem__(self, name: str) -> Option:
        return self._options[str(name)]

    def fields(self) -> List[dataclasses.Field]:
        """Every field some option reads, each once, in the order they were first declared."""
        return list(self._fields.values())

    def uses(self) -> Tuple[Tuple[str, ...], Dict[str, set]]:
        """(the fields considered, {option: the fields it reads}): checks.py USES's entry for this choice."""
        return tuple(self._fields), {n: {f.name for f in fields(o.settings)} for n, o in self._options.items()}

    def builder(self, name: str) -> Callable:
        """The function that builds option `name`, imported now."""
        name = str(name)
        if name not in self._options:
            why = self.broken.get(name, f"the options are {', '.join(self._options)}")
            raise UserError(f"{self.key}={name} is not an option the runner has: {why}.")
        module, _, attr = self._options[name].builder.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise UserError(f"{self.key}={name}: its builder {module}:{attr} cannot be imported ({e}).") from None

    def table(self, first: str, second: str) -> str:
        """The docs' markdown table of the options (columns `first`, `second`, reads): name, summary, fields."""
        rows = [f"| {first} | {second} | reads |", "|---|---|---|"]
        for name, o in self._options.items():
            reads = ", ".join(f"`{f.name}`" for f in fields(o.settings)) or "nothing more"
            rows.append(f"| `{name}` | {o.summary} | {reads} |")
        return "\n".join(rows)


def _default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default
