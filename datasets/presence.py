"""Whether the files a data source reads are there, checked without MindSpore (a dry run imports none):
data.root, the folders and the named files of each source. The sources (sources.py) check the same first."""

import os

from runner.datasets.errors import DataError, not_regular

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def need_dir(path, what):
    """DataError unless path is a directory."""
    if not os.path.isdir(path):
        raise DataError(f"{what} {path!r} does not exist or is not a directory.")


def need_file(path: str, what: str) -> None:
    """DataError unless path is a regular file (missing, a folder, a FIFO: each named)."""
    if not os.path.lexists(path):
        raise DataError(f"{what} {path!r} does not exist.")
    why = "a directory" if os.path.isdir(path) else not_regular(path)
    if why:
        raise DataError(f"{what} {path!r} is {why}; it must be a regular file.")


# The files a source reads from data.root: (names, what they are, where they come from).
NAMED_FILES = {
    "cifar10": (
        tuple(f"data_batch_{i}.bin" for i in range(1, 6)) + ("test_batch.bin",),
        "CIFAR-10 binary files",
        "the 'binary version' download",
    ),
    "cifar100": (("train.bin", "test.bin"), "CIFAR-100 binary files", "the 'binary version' download"),
    "mnist": (MNIST_FILES, "the MNIST idx files", "uncompressed: gunzip the downloaded *.gz"),
}


# The files data=csv and data=mindrecord start from (their readers check their content).
LISTED = {"csv": ("train.csv", "val.csv"), "mindrecord": ("train.mindrecord", "val.mindrecord", "classes.json")}


def root_with_files(cfg) -> str:
    """data.root, checked to be a directory holding the regular files its source names (NAMED_FILES)."""
    root = os.path.expanduser(cfg.root)
    need_dir(root, "data.root")
    names, what, origin = NAMED_FILES.get(cfg.name, ((), "", ""))
    missing = [n for n in names if not os.path.lexists(os.path.join(root, n))]
    if missing:
        raise DataError(f"data.root {root!r} lacks {what} {list(missing)} ({origin}).")
    for n in names:
        need_file(os.path.join(root, n), f"The {what[:-1].replace('the ', '')}")
    return root


def check_present(cfg) -> None:
    """What a run checks of its data before reading any of it (dry_run=true checks it too): data.root is a
    directory with the folders and files its source reads. No image is opened."""
    if cfg.name in ("digits", "synthetic"):
        return  # generated or bundled: nothing on disk to check
    root = root_with_files(cfg)
    if cfg.name == "imagefolder":
        for split in ("train", "val"):
            need_dir(os.path.join(root, split), f"data.root must contain {split}/; missing:")
    for name in LISTED.get(cfg.name, ()):
        if not os.path.lexists(os.path.join(root, name)):
            raise DataError(f"data.root {root!r} lacks {name}.")
