"""MindRecord, MindSpore's own dataset format: convert an image folder into it, and read it back.

`python -m runner.datasets.mindrecord <image folder root> <output dir>` writes `train.mindrecord` and
`val.mindrecord` (each with MindSpore's `.db` index) and `classes.json` from `root/{train,val}/<class>/*`.
Each record keeps the file's encoded bytes (decoded by MindSpore's Decode when read, as image-folder
files are), its label and its height and width, so `data=mindrecord` knows every sample's size
without decoding. Reading one large file instead of many small ones is what the format is for.
The output folder also gets `conversion.json`, the manifest that marks a finished conversion: only
such a folder (or a new or empty one) is written to again.
"""

import json
import os
import sys
from typing import Optional

import numpy as np

from runner.datasets.errors import DataError, error_reason

SPLITS = ("train", "val")
CLASSES = "classes.json"
SCHEMA = {
    "image": {"type": "bytes"},
    "label": {"type": "int32"},
    "height": {"type": "int32"},
    "width": {"type": "int32"},
}


MANIFEST = "conversion.json"  # written last: OUT holds a finished conversion, and which files are its own
SKIP_ADVICE = "run the converter with --skip-bad to leave such files out"


def _outputs() -> list:
    return [f"{split}.mindrecord{ext}" for split in SPLITS for ext in ("", ".db")] + [CLASSES]


def _check_out(dst: str) -> bool:
    """Whether dst holds a finished conversion to replace (False: dst is absent or an empty folder).

    DataError for anything else, before a single file is written: a file, a symbolic link, or a folder
    holding files this converter did not write in a conversion that finished (its manifest lists them).
    """
    if os.path.islink(dst):
        raise DataError(f"The output {dst!r} is a symbolic link; name the directory itself (nothing was written).")
    if not os.path.lexists(dst):
        return False
    if not os.path.isdir(dst):
        raise DataError(
            f"The output {dst!r} is an existing file, not a directory; name a new or empty directory "
            "(nothing was written)."
        )
    entries = set(os.listdir(dst))
    if not entries:
        return False
    own = None
    if MANIFEST in entries:
        try:
            with open(os.path.join(dst, MANIFEST)) as f:
                own = json.load(f).get("files")
        except (OSError, ValueError, AttributeError):
            own = None
    if not isinstance(own, list) or entries - set(own) - {MANIFEST}:
        foreign = sorted(entries - set(own or []) - {MANIFEST})
        raise DataError(
            f"The output {dst!r} holds files that are not a finished conversion of this command "
            f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); it would replace or mix with them. "
            "Name a new or empty directory (nothing was written)."
        )
    return True


def _checked_images(src: str, classes: list, on_bad_sample: str):
    """({split: [((path, class), (height, width))]}, the images skipped): every image checked before anything
    is written."""
    from runner.datasets.sources import _image_sizes

    listed, skipped = {}, []
    for split in SPLITS:
        folder = os.path.join(src, split)
        present = [c for c in classes if os.path.isdir(os.path.join(folder, c))]
        sizes, good, bad, empty = _image_sizes(folder, present, on_bad_sample, SKIP_ADVICE)
        if split == "train" and empty:
            raise DataError(
                f"Class folders with no images in {folder!r}: {empty}. A class needs training images; "
                "add some or remove the folder (nothing was written)."
            )
        skipped += bad
        listed[split] = list(zip(good, sizes))
    return listed, skipped


def _write_split(path: str, listed: list, index: dict, dst: str) -> None:
    """One split's MindRecord file at path from its checked images, 1024 rows at a time (bounded memory)."""
    from mindspore.mindrecord import FileWriter

    from runner.datasets.sources import not_regular

    writer = FileWriter(file_name=path, shard_num=1, overwrite=True)
    writer.add_schema(SCHEMA, "runner image folder")
    rows = []
    for (image, c), (h, w) in listed:
        why = not_regular(image)  # replaced by something else since it was checked
        if why:
            raise DataError(f"{image!r} changed while converting: {why}; nothing was written to {dst!r}.")
        with open(image, "rb") as f:
            rows.append({"image": f.read(), "label": index[c], "height": int(h), "width": int(w)})
        if len(rows) == 1024:
            writer.write_raw_data(rows)
            rows = []
    if rows:
        writer.write_raw_data(rows)
    writer.commit()


def convert(src: str, dst: str, on_bad_sample: str = "error") -> dict:
    """Write dst/{train,val}.mindrecord and dst/classes.json from the image folder src; return counts.

    Nothing is written until every image has been checked (data=imagefolder's checks: the same class
    rules, regular files only, each decoded once). The files are written into a new sibling folder and
    renamed into place with a manifest, so dst is always either what it was or a finished conversion:
    an earlier conversion of this command is replaced whole, anything else in dst is refused.
    """
    import shutil
    import tempfile

    from runner.datasets.sources import folder_classes

    src, dst = os.path.expanduser(src), os.path.abspath(os.path.expanduser(dst))
    classes = folder_classes(src, "the image folder")
    replace = _check_out(dst)
    index = {c: i for i, c in enumerate(classes)}
    listed, skipped = _checked_images(src, classes, on_bad_sample)
    parent = os.path.dirname(dst)
    try:
        os.makedirs(parent, exist_ok=True)
        work = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.converting-", dir=parent)
    except OSError as e:
        raise DataError(f"Cannot write beside the output {dst!r} ({e.strerror}); nothing was written.") from None
    try:
        for split in SPLITS:
            _write_split(os.path.join(work, f"{split}.mindrecord"), listed[split], index, dst)
        with open(os.path.join(work, CLASSES), "w") as f:
            json.dump(classes, f)
        counts = {split: len(listed[split]) for split in SPLITS}
        manifest = {"files": _outputs(), "source": os.path.abspath(src), **counts, "classes": len(classes)}
        with open(os.path.join(work, MANIFEST), "w") as f:
            json.dump(manifest, f)
        os.chmod(work, 0o777 & ~_umask())  # mkdtemp's 0700 would make the output private
        # One rename puts the finished folder in place (over an empty dst too); an earlier conversion is
        # moved aside first and removed after, so a failure never leaves dst half old, half new.
        if replace:
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.old-", dir=parent)
            os.rename(dst, os.path.join(old, "out"))
            os.rename(work, dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(work, dst)
    except DataError:
        raise
    except Exception as e:  # OSError (a full disk), MindSpore's own MRM errors: the folder is left as it was
        raise DataError(
            f"Writing the conversion of {src!r} failed ({error_reason(e)}); {dst!r} is unchanged."
        ) from None
    finally:
        if os.path.isdir(work):
            shutil.rmtree(work, ignore_errors=True)
    return {**counts, "classes": len(classes), "skipped": skipped}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_split(root: str, split: str, num_classes: Optional[int] = None):
    """(dataset of (image bytes, label), (n, 2) sizes) of root/<split>.mindrecord; with num_classes,
    DataError when a label is outside 0..num_classes-1."""
    import mindspore.dataset as ds

    from runner.datasets.sources import _need_file, check_labels

    path = os.path.join(root, f"{split}.mindrecord")
    if not os.path.lexists(path) or not os.path.lexists(path + ".db"):
        raise DataError(
            f"data.root {root!r} lacks {split}.mindrecord (and its .db index): write them with "
            "`python -m runner.datasets.mindrecord <image folder> <dir>`."
        )
    _need_file(path, "The MindRecord file")
    _need_file(path + ".db", "The MindRecord index")
    try:
        meta = ds.MindDataset(path, columns_list=["label", "height", "width"], shuffle=False)
        rows = [(int(y), int(h), int(w)) for y, h, w in meta.create_tuple_iterator(num_epochs=1, output_numpy=True)]
    except RuntimeError as e:
        raise DataError(f"{path!r} cannot be read as the runner's MindRecord ({error_reason(e)}).") from None
    table = np.array(rows, np.int64).reshape(-1, 3)
    if num_classes is not None:
        check_labels(table[:, 0], num_classes, f"{path!r} (classes from {CLASSES})")
    return ds.MindDataset(path, columns_list=["image", "label"], shuffle=False), table[:, 1:]


def read_classes(root: str) -> list:
    """The class names classes.json lists, in label order."""
    from runner.datasets.sources import _need_file

    path = os.path.join(root, CLASSES)
    if os.path.lexists(path):
        _need_file(path, "The class list")
    try:
        with open(path) as f:
            classes = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(
            f"data.root {root!r}: {CLASSES} cannot be read ({e}); it is written with the .mindrecord files."
        ) from None
    if not isinstance(classes, list) or not classes:
        raise DataError(f"{path!r} is not a list of class names.")
    return [str(c) for c in classes]


def main(argv=None) -> int:
    """The command: convert, print what was written, exit 2 with one paragraph on bad input."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or (len(args) == 3 and args[2] not in ("--skip-bad", "--skip_bad")):
        print(
            "usage: python -m runner.datasets.mindrecord <image folder root> <output dir> [--skip-bad]\n"
            "Writes train.mindrecord, val.mindrecord and classes.json from root/{train,val}/<class>/*; "
            "train from them with data=mindrecord data.root=<output dir>.",
            file=sys.stderr,
        )
        return 2
    try:
        done = convert(args[0], args[1], "skip" if len(args) == 3 else "error")
    except DataError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    left = f"; {len(done['skipped'])} unreadable file(s) left out" if done["skipped"] else ""
    print(
        f"{done['train']} training and {done['val']} validation images of {done['classes']} classes -> {args[1]}{left}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
