"""`runner-configs ls` lists the built-in config groups and their options; `runner-configs cp <group>/<option>
[<dest>]` copies one into a local directory to edit (what torchtune's `tune ls` / `tune cp` do).

    runner-configs ls
    runner-configs cp experiment/quick                # -> conf/experiment/my_quick.yaml
    runner-configs cp optim/sgd conf/optim/fast_sgd.yaml
    runner-train --config-dir conf optim=fast_sgd     # your options beside the built-in ones

A copy needs a name of its own: under --config-dir, a file named like a built-in option is hidden by the
built-in one (Hydra finds the packaged groups first), so the default name is my_<option>.

`python -m runner.builtin_configs ...` is the same command. (The module is not named configs: runner/config/
is the configuration's schema and checks, this is the library of packaged config files.)
"""

import os
import shutil
from importlib import resources
from typing import Dict, List, Optional

from runner.errors import ConfigError

# Groups that only other configs select (the rungs of experiment=ladder): not for a command line.
INTERNAL = ("ladder",)
PRIMARY = {
    "config": "runner-train",
    "evaluate": "runner-evaluate",
    "predict": "runner-predict",
    "export": "runner-export",
}


def groups() -> Dict[str, List[str]]:
    """Every config group shipped in runner.conf (nested ones as `hydra/sweeper`) -> its option names."""
    found: Dict[str, List[str]] = {}

    def walk(node, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir() and not child.name.startswith(("_", ".")):
                walk(child, f"{prefix}{child.name}/")
            elif prefix and child.name.endswith(".yaml"):
                found.setdefault(prefix.rstrip("/"), []).append(child.name[: -len(".yaml")])

    walk(resources.files("runner.conf"), "")
    return {g: found[g] for g in sorted(found) if g.split("/")[0] not in INTERNAL}


def listing() -> str:
    """What `ls` prints: one line per group with its options, then the commands' own configs."""
    table = groups()
    width = max(map(len, table)) + 2
    lines = [
        "Config groups (choose an option with <group>=<option>; copy one with runner-configs cp <group>/<option>):"
    ]
    for group, options in table.items():
        lines.append(f"  {group:<{width}}{'  '.join(options)}")
    lines.append("Each command's own config (runner-configs cp <name> copies it): " + ", ".join(PRIMARY))
    return "\n".join(lines)


def source(name: str):
    """The packaged file of `<group>/<option>` or of a command's own config; ConfigError naming the choices."""
    name = name[: -len(".yaml")] if name.endswith(".yaml") else name
    group, _, option = name.rpartition("/")
    if not group and option in PRIMARY:
        return resources.files("runner.conf").joinpath(f"{option}.yaml")
    table = groups()
    if group not in table:
        raise ConfigError(
            f"runner-configs cp {name}: no config group {group or name!r}. Name a group and one of its options, "
            f"e.g. optim/sgd; the groups are {', '.join(table)} (runner-configs ls lists their options)."
        )
    if option not in table[group]:
        raise ConfigError(
            f"runner-configs cp {name}: the group {group!r} has no option {option!r}; its options are "
            f"{', '.join(table[group])}."
        )
    return resources.files("runner.conf").joinpath(*group.split("/")).joinpath(f"{option}.yaml")


def destination(name: str, dest: Optional[str]) -> str:
    """Where `cp` writes: dest when it names a .yaml file, else <dest or ./conf>/<group>/my_<option>.yaml."""
    name = name[: -len(".yaml")] if name.endswith(".yaml") else name
    group, _, option = name.rpartition("/")
    if dest and dest.endswith((".yaml", ".yml")):
        built_in = groups().get(group, []) if group else list(PRIMARY)
        stem = os.path.basename(dest).rsplit(".", 1)[0]
        if stem in built_in:
            raise ConfigError(
                f"runner-configs cp: {dest} would be hidden by the built-in {name} (Hydra finds the packaged "
                f"configs first), so your edits would never be used; give the copy a name of its own, "
                f"e.g. {os.path.join(os.path.dirname(dest), 'my_' + os.path.basename(dest))}."
            )
        return dest
    return os.path.join(dest or "conf", group, f"my_{option}.yaml")


def copy(name: str, dest: Optional[str]) -> str:
    """Copy the packaged config into dest (never over an existing file); return the path written."""
    src = source(name)
    target = destination(name, dest)
    if os.path.islink(target):
        raise ConfigError(
            f"runner-configs cp: {target} is a symbolic link (to {os.readlink(target)}); nothing was copied, "
            "so the file it points to is untouched. Name another destination."
        )
    if os.path.lexists(target):
        raise ConfigError(f"runner-configs cp: {target} exists already; nothing was copied. Name another destination.")
    try:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        # O_EXCL: never through a symbolic link or over a file that appeared since the check above.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        where = e.filename or target
        raise ConfigError(
            f"runner-configs cp: cannot create {target} ({e.strerror}: {where}); nothing was copied. A folder on "
            "the way may be a file: name a directory, or a .yaml path under one."
        ) from None
    with os.fdopen(fd, "wb") as out, resources.as_file(src) as path, open(path, "rb") as f:
        shutil.copyfileobj(f, out)
    return target


def usage_after_copy(name: str, target: str) -> str:
    """How to use the copy: where --config-dir points and which option name selects it."""
    name = name[: -len(".yaml")] if name.endswith(".yaml") else name
    group = name.rpartition("/")[0]
    option = os.path.basename(target).rsplit(".", 1)[0]
    if not group:
        root = os.path.dirname(target) or "."
        return f"Run it with: {PRIMARY.get(name, 'runner-train')} --config-dir {root} --config-name {option}"
    parent = os.path.dirname(target)
    if not parent.replace(os.sep, "/").endswith(group):
        # Hydra finds an option of a group only in a folder named after the group under --config-dir.
        root = parent or "."
        moved = os.path.join(root, group, os.path.basename(target))
        return (
            f"Hydra selects it only from a folder named {group}/ under --config-dir: move it there "
            f"(mkdir -p {os.path.dirname(moved)} && mv {target} {moved}), then: "
            f"runner-train --config-dir {root} {group}={option}"
        )
    root = parent[: -len(group)].rstrip("/") or "."
    return f"Edit it, then: runner-train --config-dir {root} {group}={option}"


if __name__ == "__main__":  # `python -m runner.builtin_configs`: runner-configs (runner/cli/commands.py)
    from runner.cli.commands import configs

    configs()
