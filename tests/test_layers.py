"""The layers: models/ and datasets/ (installed as runner.models, runner.datasets) work without the runner.

They ship inside the runner's one import namespace, so the rule is that each imports only itself:
nothing from the rest of runner, not each other.
"""

import ast
import subprocess
import sys

import pytest
from conftest import REPO
from docs_pages import page


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
    block = page("layout.md").split("```")[1]  # docs/layout.md's first code block: the tree
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
