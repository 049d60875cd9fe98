"""The layers: models/ and datasets/ (installed as runner.models, runner.datasets) work without the runner,
and runner/'s own parts import only downwards, in the order of LAYERS.

models/ and datasets/ ship inside the runner's one import namespace, so the rule is that each imports only
itself: nothing from the rest of runner, not each other.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from docs_pages import page

# runner/'s parts from the bottom up; a part may import its own modules and those of the parts below it.
# Parts on one rung (amp, report) do not import each other. errors.py, config/ ... cli/ are folders or files
# of runner/; "commands" is every other module at runner/'s top (api, evaluate, predict, export, builtin_configs,
# saved_model and any new one); "entry" is cli/ with runner/__main__.py.
LAYERS = [["errors"], ["config"], ["rundir"], ["amp", "report"], ["training"], ["commands"], ["entry"]]
RUNG = {part: rung for rung, parts in enumerate(LAYERS) for part in parts}
OUTSIDE = ("runner.models", "runner.datasets", "runner.conf")  # the lower layers, tested above; data files


def part_of(module: str):
    """The part of runner/ a dotted module name belongs to; None outside runner's own parts."""
    names = module.split(".")
    if names[0] != "runner" or module.startswith(OUTSIDE):
        return None
    if len(names) == 1:
        return "package"  # runner/__init__.py: names the public API, imported from its home on first use
    if names[1] in ("cli", "__main__"):
        return "entry"
    return names[1] if names[1] in RUNG else "commands"


def module_name(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_main_block(node) -> bool:
    """`if __name__ == "__main__":`: the module run as a script, which is an entry point of its own."""
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def imports_of(path: Path, root: Path = REPO):
    """(line, imported module) for every import in the file, at module level and inside functions alike,
    relative ones resolved; `from package import module` names the module. Not inside `if __name__ ==
    "__main__":`."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    skipped = {id(n) for block in ast.walk(tree) if is_main_block(block) for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:
                yield node.lineno, f"{base}.{a.name}" if base == "runner" or not node.module else base


def runner_files():
    return [p for p in sorted((REPO / "runner").rglob("*.py")) if part_of(module_name(p)) is not None]


def edges():
    """(importing file, line, importing part, imported module, imported part) for runner's own parts."""
    for path in runner_files():
        source = part_of(module_name(path))
        for line, target in imports_of(path):
            part = part_of(target)
            if part is not None and part != source:
                yield path.relative_to(REPO), line, source, target, part


def test_runner_parts_import_only_downwards():
    wrong = [
        f"{path}:{line}: {source} imports {target} ({part}), which is not below it"
        for path, line, source, target, part in edges()
        if source != "package" and (part == "package" or RUNG[part] >= RUNG[source])
    ]
    assert not wrong, (
        "runner/'s layer order (errors < config < rundir < amp, report < training < commands < entry):\n"
        + "\n".join(wrong)
    )


def test_no_import_cycle_between_runner_modules():
    """Between modules too, not only parts: a cycle hidden in function-level imports is still a cycle."""
    graph = {}
    for path in runner_files():
        module = module_name(path)
        graph[module] = {t for _, t in imports_of(path) if part_of(t) not in (None, "package") and t != module}
    known = set(graph)
    graph = {m: {t if t in known else t.rsplit(".", 1)[0] for t in ts} & known for m, ts in graph.items()}
    # A package's __init__ runs before its modules; a module importing its own package is no cycle.
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                cycles.append(" -> ".join(stack[stack.index(t) :] + [t]))
            elif t not in state:
                visit(t, stack + [t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles inside runner/:\n" + "\n".join(cycles)


def test_the_layer_check_sees_imports_inside_functions(tmp_path):
    """The check reads function-level imports and resolves relative ones: a test that could never fail is no test."""
    (tmp_path / "runner" / "rundir").mkdir(parents=True)
    bad = tmp_path / "runner" / "rundir" / "bad.py"
    bad.write_text("def f():\n    from ..training import recipe\n    from runner.cli.app import entry_point\n")
    found = [t for _, t in imports_of(bad, tmp_path)]
    assert [part_of(t) for t in found] == ["training", "entry"], found


def test_lower_layers_import_nothing_from_the_runner():
    offenders = []
    for package in ("models", "datasets"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                own = f"runner.{package}"
                offenders += [
                    f"{path.relative_to(REPO)}: {n}"
                    for n in names
                    if n.split(".")[0] == "runner" and n != own and not n.startswith(own + ".")
                ]
    assert not offenders, offenders


@pytest.mark.slow
def test_a_notebook_builds_data_and_a_model_without_the_runner():
    code = (
        "import sys\n"
        "from runner.datasets import DataConfig, PaddingConfig, DataError, build_data\n"
        "from runner.models import ModelConfig, ModelError, build_model\n"
        "from omegaconf import OmegaConf\n"
        "data = build_data(OmegaConf.structured(DataConfig(name='digits')),\n"
        "                  OmegaConf.structured(PaddingConfig(name='fixed', height=8, width=8)), 32, 0)\n"
        "net = build_model(ModelConfig(name='resnet8', style='cifar', depth=8, width=4), data.num_classes, 1, 8)\n"
        "try:\n"
        "    build_model(ModelConfig(name='r', style='cifar', depth=9), 10, 1, 8)\n"
        "except ModelError as e:\n"
        "    print('refused:', e)\n"
        "print(data.steps_per_epoch, sum(p.size for p in net.trainable_params()))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'runner'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    refused, sizes, runner_modules = out.strip().splitlines()[-3:]
    assert "depth must be one of [8, 20, 56], got 9" in refused
    assert sizes.split()[0] == str((1797 - 359) // 32)
    # `runner` itself is imported as the namespace's parent: it must stay empty of the runner's layers.
    loaded = ast.literal_eval(runner_modules)
    assert [m for m in loaded if m != "runner" and not m.startswith(("runner.models", "runner.datasets"))] == []
    assert "runner.models" in loaded and "runner.datasets" in loaded


def test_the_layout_page_names_every_module():
    block = page("layout.md").split("```")[1].split("\n", 1)[1]  # docs/layout.md's first code block: the tree
    named = {}  # folder -> the file names listed under it, by indentation
    stack = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        entry = line.split()[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = "/".join(e for _, e in stack).replace("//", "/")
        named.setdefault(parent.rstrip("/"), set()).add(entry.rstrip("/"))
        if entry.endswith("/"):
            stack.append((indent, entry.rstrip("/")))
    missing = []
    for package in ("runner", "models", "datasets"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO)
            if path.name == "__init__.py" and rel.parent.name != "runner":
                continue  # a subpackage is named by its folder
            if rel.name not in named.get(str(rel.parent), set()):
                missing.append(str(rel))
    assert not missing, f"docs/layout.md's tree does not name: {missing}"


EXITS = {"exit", "_exit", "SystemExit", "print_user_error"}  # sys.exit, os._exit, raise/except SystemExit


def exits_in(path: Path):
    """(line, name) of every use of an exit (or of printing a user's error) in a file, by its syntax tree."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in EXITS and getattr(node.value, "id", "") in ("sys", "os"):
            yield node.lineno, f"{node.value.id}.{node.attr}"
        elif isinstance(node, ast.Name) and node.id in EXITS:
            yield node.lineno, node.id
        elif isinstance(node, ast.alias) and node.name in EXITS:
            yield getattr(node, "lineno", 0), node.name


def test_only_the_entry_point_exits():
    """Below runner/cli/ and runner/__main__.py a user's mistake is raised (UserError), an interrupt too
    (Interrupted): the entry point alone prints it and chooses the exit status."""
    found = [
        f"{path.relative_to(REPO)}:{line}: {name}"
        for path in runner_files()
        if part_of(module_name(path)) != "entry"
        for line, name in exits_in(path)
    ]
    assert not found, "exits below the entry point:\n" + "\n".join(found)
    planted = [name for _, name in exits_in(REPO / "runner" / "cli" / "app.py")]
    assert "sys.exit" in planted and "print_user_error" in planted  # the check sees them where they belong


MAX_FUNCTION_LINES = 60  # CONTRIBUTING: a longer function is split into named steps a reader can follow


def long_functions(path: Path, root: Path = REPO, limit: int = MAX_FUNCTION_LINES):
    """'file: Class.function (N lines)' for each function (methods and nested ones too) over limit lines,
    counted from its `def` (decorators not included) to its last line."""

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                if lines > limit:
                    yield f"{path.relative_to(root)}: {prefix}{child.name}", lines
                yield from visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(ast.parse(path.read_text()), "")


def test_no_function_in_runner_or_its_lower_layers_is_over_60_lines():
    paths = [p for top in ("runner", "models", "datasets") for p in sorted((REPO / top).rglob("*.py"))]
    found = {name: lines for path in paths for name, lines in long_functions(path)}
    too_long = [f"{name} ({lines} lines)" for name, lines in found.items()]
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines; split each into named steps:\n" + "\n".join(
        too_long
    )


def test_the_length_check_counts_methods_and_nested_functions(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(60))
    planted = tmp_path / "planted.py"
    planted.write_text(f"class A:\n    def long(self):\n{body}\n    def short(self):\n        pass\n")
    assert [name for name, _ in long_functions(planted, tmp_path)] == ["planted.py: A.long"]


MAX_OPERATOR_FILE_LINES = 600


def test_the_operator_library_is_one_file_per_family_none_over_600_lines():
    from runner.models import onednn

    own = [p for p in onednn.sources() if p.parent == onednn.CSRC]
    long = [f"{p.name} ({n} lines)" for p in own if (n := len(p.read_text().splitlines())) > MAX_OPERATOR_FILE_LINES]
    assert not long, f"operator files over {MAX_OPERATOR_FILE_LINES} lines; split by operator family:\n" + "\n".join(
        long
    )
    # Every family file is in the one translation unit, and the unit includes no file that is not there.
    included = set(re.findall(r'#include "(\w+\.h)"', onednn.SOURCE.read_text()))
    assert included == {p.name for p in own if p.suffix == ".h"}
