"""Where samples come from: each source returns unbatched train/val datasets of (image HWC uint8, label).

Each source also reports every sample's (height, width) on disk, so the `padding` group can plan its
buckets, group same-size samples and report its padding cost before a single image is decoded.
"""

import gzip
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import mindspore.dataset as ds
import mindspore.dataset.transforms as T
import mindspore.dataset.vision as V
import numpy as np
from mindspore import dtype as mstype

from runner.datasets.errors import DataError, error_reason, not_regular
from runner.datasets.presence import MNIST_FILES, NAMED_FILES, need_dir, need_file, root_with_files

# Under their earlier names, which mindrecord.py imports.
_need_dir, _need_file = need_dir, need_file

# Passed to ImageFolderDataset too, so the files it decodes are exactly the files measured here.
IMAGE_EXTENSIONS = [e for ext in (".png", ".jpg", ".jpeg", ".bmp") for e in (ext, ext.upper())]


@dataclass
class Source:
    train: ds.Dataset
    val: ds.Dataset
    num_classes: int
    train_sizes: np.ndarray  # (n, 2) int: each training sample's (height, width) as stored
    val_sizes: np.ndarray
    channels_on_disk: int  # 1 or 3, before conversion to data.channels
    skipped: list = field(default_factory=list)  # unreadable files left out (data.on_bad_sample=skip)
    class_names: Optional[list] = None  # per label, where the data names its classes

    @property
    def train_size(self) -> int:
        return len(self.train_sizes)

    @property
    def val_size(self) -> int:
        return len(self.val_sizes)


def _same_size(n: int, height: int, width: int) -> np.ndarray:
    return np.tile(np.array([[height, width]], dtype=np.int64), (n, 1))


def _split(n: int, val_fraction: float, seed: int):
    order = np.random.RandomState(seed).permutation(n)
    n_val = int(round(n * val_fraction))
    if n_val >= n:
        raise DataError(
            f"data.val_fraction={val_fraction} leaves no training samples: all {n} samples would be validation. "
            f"Use a smaller fraction (at most {(n - 1) / n:.4f} for {n} samples)."
        )
    return order[n_val:], order[:n_val]


def _from_arrays(images, labels, cfg, seed, num_classes):
    tr, va = _split(len(images), cfg.val_fraction, seed)
    labels = labels.astype(np.int32)
    h, w = images.shape[1:3]

    def make(idx):
        return ds.NumpySlicesDataset({"image": images[idx], "label": labels[idx]}, shuffle=False)

    return Source(
        make(tr), make(va), num_classes, _same_size(len(tr), h, w), _same_size(len(va), h, w), images.shape[-1]
    )


def digits_arrays():
    """(images N x 8 x 8 of 0..16, labels) of scikit-learn's bundled digits, read from its file as load_digits
    reads it: importing scikit-learn took 2.6 s of every digits run (a TINY run is ~15 s), and nothing else
    here needs it. load_digits where the file is not where this scikit-learn keeps it."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    found = [Path(p) / "datasets" / "data" / "digits.csv.gz" for p in (spec and spec.submodule_search_locations) or []]
    if found and found[0].is_file():
        with gzip.open(found[0]) as f:
            data = np.loadtxt(f, delimiter=",")
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


def digits(cfg, seed):
    """scikit-learn's bundled 8x8 digits, pixel values 0..16 scaled to 0..255."""
    images, labels = digits_arrays()
    images = np.clip(images * 16, 0, 255).astype(np.uint8)[..., None]
    return _from_arrays(images, labels, cfg, seed, 10)


def synthetic(cfg, seed):
    """Learnable random images: a fixed random pattern per class plus noise."""
    rng = np.random.RandomState(seed)
    size, c = cfg.image_size, cfg.channels
    patterns = rng.randint(0, 256, (cfg.num_classes, size, size, c))
    labels = rng.randint(0, cfg.num_classes, cfg.num_samples)
    noise = rng.randint(-64, 64, (cfg.num_samples, size, size, c))
    images = np.clip(patterns[labels] // 2 + 64 + noise, 0, 255).astype(np.uint8)
    return _from_arrays(images, labels, cfg, seed, cfg.num_classes)


# Labels are class indices: far more classes than any dataset has (ImageNet-21k: 21,841) is a wrong
# column or a typo, and would allocate one class name (and one output) per index.
MAX_CLASSES = 100_000


def check_labels(labels: np.ndarray, num_classes: int, where: str) -> None:
    """DataError when a label is outside 0..num_classes-1 (MindSpore's loss would fail deep in training,
    or index past the network's outputs); the same check for every reader."""
    if labels.size == 0:
        return
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= num_classes:
        bad = lo if lo < 0 else hi
        raise DataError(
            f"{where} has label {bad}, but its {num_classes} classes are labelled 0..{num_classes - 1}. "
            "Fix the labels (or the class list) of that data."
        )


SKIP_ADVICE = "set data.on_bad_sample=skip to train without such files"


def _image_size(path: str, on_bad_sample: str, skip_advice: str = SKIP_ADVICE):
    """(height, width) of an image file, decoded once with PIL (a header alone misses truncated files);
    None for a bad file under data.on_bad_sample=skip.

    A bad file (missing, corrupt, truncated, a symbolic link to nothing, a FIFO or other non-regular
    file (never opened), or beyond PIL's decompression-bomb limit) is an error naming it, or with
    data.on_bad_sample=skip it is left out. skip_advice: how the caller's user skips such files.
    """
    from PIL import Image

    try:
        why = not_regular(path)
        if why:
            raise OSError(f"{why}, so it is not opened")
        with Image.open(path) as im:
            im.load()
            return im.height, im.width
    # PIL's errors for corrupt or truncated data; DecompressionBombError (over 2x
    # Image.MAX_IMAGE_PIXELS, ~179 megapixels) is none of them.
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        if on_bad_sample == "error":
            raise DataError(
                f"{path!r} is not a readable image ({e}). Remove or replace it, or {skip_advice}."
            ) from None
        return None


def _image_sizes(folder, classes, on_bad_sample: str, skip_advice: str = SKIP_ADVICE):
    """(height, width) of every decodable image under folder/<class>/, the good files as (path, class),
    the files that are not decodable, and the classes without images (see _image_size)."""
    sizes, good, bad, empty = [], [], [], []
    for c in classes:
        found = 0
        for entry in sorted(os.scandir(os.path.join(folder, c)), key=lambda e: e.name):
            # A dangling symlink is neither a file nor a directory; MindSpore's reader would list it.
            if entry.is_dir() or os.path.splitext(entry.name)[1] not in IMAGE_EXTENSIONS:
                continue
            size = _image_size(entry.path, on_bad_sample, skip_advice)
            if size is None:
                bad.append(entry.path)
                continue
            sizes.append(size)
            good.append((entry.path, c))
            found += 1
        if not found:
            empty.append(c)
    if len(empty) == len(classes):
        raise DataError(f"{folder!r} has no image files ({', '.join(IMAGE_EXTENSIONS[::2])}) in its class folders.")
    return np.array(sizes, dtype=np.int64).reshape(-1, 2), good, bad, empty


def _listed_files(good, index):
    """A dataset of exactly these (path, class) files: ImageFolderDataset cannot leave files out, and
    MindSpore's skip mode covers only map ops (its reader fails on a dangling link; its decoder has no
    decompression-bomb limit and would decode a 179-megapixel image)."""
    paths = [p for p, _ in good]
    labels = np.array([index[c] for _, c in good], dtype=np.int32)
    d = ds.NumpySlicesDataset({"image": np.arange(len(paths), dtype=np.int64), "label": labels}, shuffle=False)
    return d.map(lambda i: _read_checked(paths[int(i)]), "image")


CHANGED = "changed since the run checked its data"  # marks the reader's own error inside MindSpore's


def _read_checked(path: str) -> np.ndarray:
    """The bytes of a file the source checked when it was built; an error naming it when it has been
    removed or replaced by something that is no regular file since (never opening a FIFO)."""
    why = not_regular(path)
    if why:
        raise OSError(f"{path!r} {CHANGED} [{why}]")
    return np.fromfile(path, dtype=np.uint8)


def data_changed(err: BaseException) -> Optional[DataError]:
    """A DataError naming the file when err is MindSpore's report of a data file that was removed or
    changed while a pipeline read it (the training loop asks, so the run ends with one paragraph)."""
    import re

    text = error_reason(err)
    found = re.search(r"('[^']+') " + CHANGED + r" \[([^\]]*)\]", text)
    if found:
        detail = f"{found.group(1)} {found.group(2)}"
    elif "does not exist" in text or "No such file" in text:
        detail = text
    else:
        return None
    return DataError(
        f"The data changed while the run read it: {detail}. The files must stay in place for the whole run; "
        "what it saved so far is kept (restore the data, then resume=true continues)."
    )


def folder_classes(root: str, what: str) -> list:
    """The class folders of root/train, sorted; DataError when root, train/ or val/ is missing, train/
    has no class folder, or val/ has a class that train/ lacks (a model cannot predict a class it never
    saw: its accuracy there would be a confident 0). Shared by data=imagefolder and the MindRecord
    converter, so both accept the same folders."""
    _need_dir(root, what)
    for split in ("train", "val"):
        _need_dir(os.path.join(root, split), f"{what} must contain {split}/; missing:")
    classes = sorted(e.name for e in os.scandir(os.path.join(root, "train")) if e.is_dir())
    if not classes:
        raise DataError(f"{os.path.join(root, 'train')!r} has no class folders (expected train/<class>/*.png|jpg).")
    extra = sorted(e.name for e in os.scandir(os.path.join(root, "val")) if e.is_dir() and e.name not in set(classes))
    if extra:
        raise DataError(
            f"{os.path.join(root, 'val')!r} has class folders that train/ lacks: {extra}; every val class needs "
            "training images."
        )
    return classes


def imagefolder(cfg, seed):
    """root/train/<class>/* and root/val/<class>/*, decoded by MindSpore; classes from train."""
    root = os.path.expanduser(cfg.root)
    classes = folder_classes(root, "data.root")
    index = {c: i for i, c in enumerate(classes)}
    policy = cfg.on_bad_sample
    # MindSpore skips a sample whose map op fails only in SKIP mode; the default raises.
    mode = ds.config.ErrorSamplesMode
    ds.config.set_error_samples_mode(mode.SKIP if policy == "skip" else mode.RETURN)
    splits, sizes, skipped = {}, {}, []
    for split in ("train", "val"):
        folder = os.path.join(root, split)
        present = [c for c in classes if os.path.isdir(os.path.join(folder, c))]
        sizes[split], good, bad, empty = _image_sizes(folder, present, policy)
        if split == "train" and empty:
            raise DataError(
                f"Class folders with no images in {folder!r}: {empty}. A class needs training images; "
                "add some or remove the folder."
            )
        skipped += bad
        # Exactly the files checked above, read through _read_checked: ImageFolderDataset would list the
        # folder again when the pipeline starts, silently leaving out a file removed since (its sizes
        # above would no longer match) and failing on one removed later with no name of the run's.
        d = _listed_files(good, index)
        # Decode as a map op (not decode=True in the reader) so that the error-samples mode applies to it.
        splits[split] = d.map(V.Decode(), "image").map(T.TypeCast(mstype.int32), "label")
    # MindSpore's Decode always yields 3 channels: grayscale, palette and RGBA files included.
    return Source(splits["train"], splits["val"], len(classes), sizes["train"], sizes["val"], 3, skipped, classes)


def _read_list(path: str, root: str) -> list:
    """(image path, label, line number) rows of a `path,label` CSV file; paths relative to root; an optional
    header row `path,label`."""
    import csv

    if not os.path.lexists(path):
        raise DataError(f"data.root lacks {os.path.basename(path)}: {path!r} (rows of `path,label`).")
    _need_file(path, "The list")
    rows = []
    # utf-8-sig: a spreadsheet's "CSV UTF-8" starts with a byte-order mark, which would otherwise be part
    # of the header's first name, so the header would be read as a row of data.
    with open(path, newline="", encoding="utf-8-sig") as f:
        for n, row in enumerate(csv.reader(f), 1):
            if not row or not "".join(row).strip():
                continue
            if len(row) != 2 or not row[0].strip() or not row[1].strip():
                raise DataError(f"{path}:{n}: expected `path,label`, got {','.join(row)!r}.")
            if n == 1 and [c.strip().lower() for c in row] == ["path", "label"]:
                continue
            rows.append((os.path.join(root, os.path.expanduser(row[0].strip())), row[1].strip(), n))
    if not rows:
        raise DataError(f"{path!r} lists no images (rows of `path,label`).")
    return rows


def _is_index(label: str) -> bool:
    """A class index: ASCII digits only (str.isdigit() also accepts "²", and int() reads "٣" as 3)."""
    return label.isascii() and label.isdigit()


def _check_label_kinds(listed: dict, root: str) -> None:
    """DataError naming the row when the labels mix class indices and names: a list's labels are either all
    integers 0..K-1 or all class names, and one of the other kind (a typo, a digit of another script) would
    otherwise become a class of its own."""
    rows = [(split, label, n) for split, found in listed.items() for _, label, n in found]
    indices = [r for r in rows if _is_index(r[1])]
    names = [r for r in rows if not _is_index(r[1])]
    if not indices or not names:
        return
    (split, label, n), (other_split, other, m) = (
        (names[0], indices[0]) if len(names) <= len(indices) else (indices[0], names[0])
    )
    kinds = ("a class index", "class indices") if _is_index(label) else ("a class name", "class names")
    others = "class names" if _is_index(label) else "class indices"
    script = (
        f" written in digits of another script (int() reads {label!r} as {int(label)}; write {int(label)})"
        if label.isdecimal() and not label.isascii()
        else ""
    )
    raise DataError(
        f"{os.path.join(root, split + '.csv')}:{n}: the label {label!r} is {kinds[0]}{script}, and the list's other "
        f"labels are {others} (e.g. {other_split}.csv:{m}: {other!r}). A list's labels are all class indices 0..K-1 "
        "in ASCII digits or all class names, never both: the odd one would train as a class of its own. Fix that row."
    )


def csvlist(cfg, seed):
    """root/train.csv and root/val.csv, rows `path,label`, for data not laid out as class folders.

    Paths are relative to root (or absolute). Labels are class names, indexed in sorted order, or
    integers 0..K-1 when every label is one. Files are measured and decoded as imagefolder's are.
    """
    root = os.path.expanduser(cfg.root)
    _need_dir(root, "data.root")
    listed = {split: _read_list(os.path.join(root, f"{split}.csv"), root) for split in ("train", "val")}
    _check_label_kinds(listed, root)
    lists = {split: [(path, label) for path, label, _ in rows] for split, rows in listed.items()}
    labels = [label for rows in lists.values() for _, label in rows]
    if all(_is_index(label) for label in labels):
        top = max(int(label) for label in labels)
        if top >= MAX_CLASSES:
            where = next(split for split, rows in lists.items() if any(int(lb) == top for _, lb in rows))
            raise DataError(
                f"{where}.csv in {root!r} has the label {top}: integer labels are class indices 0..K-1, and "
                f"{top + 1} classes is beyond the {MAX_CLASSES} this runner accepts. Check the label column."
            )
        unknown = sorted({int(lb) for _, lb in lists["val"]} - {int(lb) for _, lb in lists["train"]})
        if unknown:
            raise DataError(
                f"val.csv has labels that train.csv lacks: {unknown[:5]}; every val class needs training images."
            )
        classes = [str(i) for i in range(top + 1)]
        index = {c: i for i, c in enumerate(classes)}
        index.update({label: int(label) for label in labels})  # "007" is class 7
    else:
        classes = sorted({label for _, label in lists["train"]})
        unknown = sorted({label for _, label in lists["val"]} - set(classes))
        if unknown:
            raise DataError(
                f"val.csv has labels that train.csv lacks: {unknown[:5]}; every val class needs training images."
            )
        index = {c: i for i, c in enumerate(classes)}
    policy = cfg.on_bad_sample
    mode = ds.config.ErrorSamplesMode
    ds.config.set_error_samples_mode(mode.SKIP if policy == "skip" else mode.RETURN)
    splits, sizes, skipped = {}, {}, []
    for split, rows in lists.items():
        measured = [(path, label, _image_size(path, policy)) for path, label in rows]
        good = [(path, label) for path, label, size in measured if size is not None]
        skipped += [path for path, _, size in measured if size is None]
        if not good:
            raise DataError(f"{split}.csv in {root!r} lists no readable image.")
        sizes[split] = np.array([size for *_, size in measured if size is not None], dtype=np.int64).reshape(-1, 2)
        splits[split] = _listed_files(good, index).map(V.Decode(), "image").map(T.TypeCast(mstype.int32), "label")
    return Source(splits["train"], splits["val"], len(classes), sizes["train"], sizes["val"], 3, skipped, classes)


def mindrecord(cfg, seed):
    """root/{train,val}.mindrecord and classes.json, written by `python -m runner.datasets.mindrecord`
    (datasets/mindrecord.py); read by MindSpore's MindDataset and decoded by its Decode."""
    from runner.datasets import mindrecord as mr

    root = os.path.expanduser(cfg.root)
    _need_dir(root, "data.root")
    classes = mr.read_classes(root)
    splits, sizes = {}, {}
    for split in ("train", "val"):
        d, sizes[split] = mr.read_split(root, split, len(classes))
        splits[split] = d.map(V.Decode(), "image").map(T.TypeCast(mstype.int32), "label")
    return Source(splits["train"], splits["val"], len(classes), sizes["train"], sizes["val"], 3, class_names=classes)


CIFAR_IMAGE = 3 * 32 * 32  # the R, G and B planes, row-major, after the label byte(s)


def _cifar_file(path, label_bytes: int = 1, classes: int = 10, what: str = "CIFAR-10"):
    """(images HWC uint8, labels int32) of a CIFAR binary file; CIFAR-100 records carry the coarse label
    first and the fine one (used here) second."""
    record = label_bytes + CIFAR_IMAGE
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % record:
        raise DataError(
            f"{path!r} is not {what} binary data: {raw.size} bytes is not a whole number of {record}-byte records."
        )
    records = raw.reshape(-1, record)
    labels = records[:, label_bytes - 1].astype(np.int32)
    check_labels(labels, classes, f"{path!r} ({what})")
    return records[:, label_bytes:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def cifar10(cfg, seed):
    """CIFAR-10 binary files in data.root (data_batch_1..5.bin train, test_batch.bin val).

    Read with numpy, not MindSpore's Cifar10Dataset: that reader insists on exactly 10000 records per
    file (cifar_op.cc), so subsets and small test sets in the same format fail there.
    """
    root = root_with_files(cfg)
    names = NAMED_FILES["cifar10"][0]
    parts = [_cifar_file(os.path.join(root, n)) for n in names]  # CIFAR-10: one label byte, 10 classes
    train = (np.concatenate([p[0] for p in parts[:5]]), np.concatenate([p[1] for p in parts[:5]]))
    test = parts[5]

    def make(images, labels):
        return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False)

    sizes = _same_size(len(train[1]), 32, 32), _same_size(len(test[1]), 32, 32)
    return Source(make(*train), make(*test), 10, *sizes, 3, class_names=CIFAR10_CLASSES)


def cifar100(cfg, seed):
    """CIFAR-100 binary files in data.root (train.bin, test.bin; fine labels, 100 classes; class names
    from fine_label_names.txt when present).

    Read with numpy, not MindSpore's Cifar100Dataset, for the reason cifar10 is: that reader refuses a
    file that is not the full 50000/10000 records ("Invalid cifar100 file, failed to read data"
    on a 30-record train.bin, MindSpore 2.10), so subsets and small test sets fail there.
    """
    root = root_with_files(cfg)
    train, test = (_cifar_file(os.path.join(root, n), 2, 100, "CIFAR-100") for n in ("train.bin", "test.bin"))
    names_file = os.path.join(root, "fine_label_names.txt")
    names = None
    if os.path.lexists(names_file):
        _need_file(names_file, "The class names file")
        with open(names_file) as f:
            names = [line.strip() for line in f if line.strip()] or None
        if names is not None and len(names) != 100:
            raise DataError(f"{names_file!r} names {len(names)} classes; CIFAR-100 has 100 (one per line).")

    def make(images, labels):
        return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False)

    sizes = _same_size(len(train[1]), 32, 32), _same_size(len(test[1]), 32, 32)
    return Source(make(*train), make(*test), 100, *sizes, 3, class_names=names)


def _mnist_labels(path: str) -> None:
    """Check an idx1 label file's labels (MindSpore's MnistDataset reads them unchecked, and a label of
    10 or more fails in the loss deep in training); a malformed header is left to MnistDataset's own check."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size < 8 or int.from_bytes(raw[:4].tobytes(), "big") != 2049:
        return
    check_labels(raw[8:], 10, repr(path))


def mnist(cfg, seed):
    """MNIST (or Fashion-MNIST) idx files in data.root, read by MindSpore's MnistDataset: train-* for
    training, t10k-* for validation (any number of images; 28x28 gray)."""
    root = root_with_files(cfg)
    for name in MNIST_FILES[1::2]:
        _mnist_labels(os.path.join(root, name))
    splits, sizes = {}, {}
    for usage in ("train", "test"):
        d = ds.MnistDataset(root, usage=usage, shuffle=False)
        try:
            n = d.get_dataset_size()  # reads and checks the idx headers
        except RuntimeError as e:
            detail = error_reason(e)
            raise DataError(
                f"The MNIST files in {root!r} cannot be read by MindSpore's MnistDataset: {detail}"
            ) from None
        splits[usage] = d.map(T.TypeCast(mstype.int32), "label")  # MnistDataset's labels are uint32
        sizes[usage] = _same_size(n, 28, 28)
    return Source(splits["train"], splits["test"], 10, sizes["train"], sizes["test"], 1)


# The order of CIFAR-10's labels 0..9 (batches.meta.txt of the binary version).
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


SOURCES = {
    "digits": digits,
    "synthetic": synthetic,
    "imagefolder": imagefolder,
    "cifar10": cifar10,
    "cifar100": cifar100,
    "mnist": mnist,
    "csv": csvlist,
    "mindrecord": mindrecord,
}


# Fields that decide which samples synthetic generates (with the seed): equal fields, equal samples.
_SYNTHETIC_DATA = ("num_classes", "num_samples", "image_size", "channels")


def _listed_paths(cfg) -> Optional[dict]:
    """{split: set of real paths} of an image folder's or CSV list's files, without decoding them;
    None for other sources or a root that cannot be listed (the reader names that problem itself)."""
    root = os.path.expanduser(cfg.root or "")
    found = {}
    try:
        for split in ("train", "val"):
            if cfg.name == "imagefolder":
                folder = os.path.join(root, split)
                paths = [
                    e.path
                    for c in os.scandir(folder)
                    if c.is_dir()
                    for e in os.scandir(c.path)
                    if os.path.splitext(e.name)[1] in IMAGE_EXTENSIONS
                ]
            elif cfg.name == "csv":
                paths = [p for p, *_ in _read_list(os.path.join(root, f"{split}.csv"), root)]
            else:
                return None
            found[split] = {os.path.realpath(p) for p in paths}
    except (OSError, DataError):
        return None
    return found


def training_overlap(trained, trained_seed: int, evaluated, eval_seed: int) -> Optional[dict]:
    """How many validation samples of the data settings `evaluated` (split with eval_seed) were training
    samples of `trained` (split with trained_seed): {"val_samples", "seen_in_training", "how"}; None
    when the two cannot share samples or it cannot be told (other sources: their validation set is a
    separate file or folder of the same root, or data the model never saw).

    digits and synthetic split one sample pool by a permutation of the seed (`_split`), so another seed
    or a larger val_fraction puts training samples into validation; an image folder or CSV list may
    name the very files another root trained on.
    """
    if str(trained.name) != str(evaluated.name):
        return None
    name = str(evaluated.name)
    if name in ("digits", "synthetic"):
        if name == "synthetic" and (
            trained_seed != eval_seed or any(trained[k] != evaluated[k] for k in _SYNTHETIC_DATA)
        ):
            return None  # generated from other settings: other samples
        if name == "digits":
            n = len(digits_arrays()[1])
        else:
            n = int(evaluated.num_samples)
        train, _ = _split(n, trained.val_fraction, trained_seed)
        _, val = _split(n, evaluated.val_fraction, eval_seed)
        how = f"seed {trained_seed}, val_fraction {trained.val_fraction} -> seed {eval_seed}, {evaluated.val_fraction}"
        return {"val_samples": int(len(val)), "seen_in_training": int(np.intersect1d(train, val).size), "how": how}
    a, b = _listed_paths(trained), _listed_paths(evaluated)
    if a is None or b is None:
        return None
    how = f"files of {evaluated.root}/val* that {trained.root} trains on"
    return {"val_samples": len(b["val"]), "seen_in_training": len(a["train"] & b["val"]), "how": how}
