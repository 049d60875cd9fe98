"""MindRecord, MindSpore's own dataset format: convert an image folder into it, and read it back.

`python -m runner.datasets.mindrecord <image folder root> <output dir>` writes `train.mindrecord` and
`val.mindrecord` (each with MindSpore's `.db` index) and `classes.json` from `root/{train,val}/<class>/*`.
Each record keeps the file's encoded bytes (decoded by MindSpore's Decode when read, as image-folder
files are), its label and its height and width, so `data=mindrecord` knows every sample's size
without decoding. Reading one large file instead of many small ones is what the format is for.
"""

import json
import os
import sys

import numpy as np

from runner.datasets.errors import DataError

SPLITS = ("train", "val")
CLASSES = "classes.json"
SCHEMA = {
    "image": {"type": "bytes"},
    "label": {"type": "int32"},
    "height": {"type": "int32"},
    "width": {"type": "int32"},
}


def convert(src: str, dst: str, on_bad_sample: str = "error") -> dict:
    """Write dst/{train,val}.mindrecord and dst/classes.json from the image folder src; return counts."""
    from mindspore.mindrecord import FileWriter

    from runner.datasets.sources import _image_sizes, _need_dir

    src, dst = os.path.expanduser(src), os.path.expanduser(dst)
    _need_dir(src, "the image folder")
    for split in SPLITS:
        _need_dir(os.path.join(src, split), f"the image folder must contain {split}/; missing:")
    classes = sorted(e.name for e in os.scandir(os.path.join(src, "train")) if e.is_dir())
    if not classes:
        raise DataError(f"{os.path.join(src, 'train')!r} has no class folders (expected train/<class>/*.png|jpg).")
    index = {c: i for i, c in enumerate(classes)}
    os.makedirs(dst, exist_ok=True)
    counts, skipped = {}, []
    for split in SPLITS:
        folder = os.path.join(src, split)
        present = [c for c in classes if os.path.isdir(os.path.join(folder, c))]
        sizes, good, bad, _ = _image_sizes(folder, present, on_bad_sample)
        skipped += bad
        writer = FileWriter(file_name=os.path.join(dst, f"{split}.mindrecord"), shard_num=1, overwrite=True)
        writer.add_schema(SCHEMA, "runner image folder")
        rows = []
        for (path, c), (h, w) in zip(good, sizes):
            with open(path, "rb") as f:
                rows.append({"image": f.read(), "label": index[c], "height": int(h), "width": int(w)})
            if len(rows) == 1024:  # bounded memory for large folders
                writer.write_raw_data(rows)
                rows = []
        if rows:
            writer.write_raw_data(rows)
        writer.commit()
        counts[split] = len(good)
    with open(os.path.join(dst, CLASSES), "w") as f:
        json.dump(classes, f)
    return {**counts, "classes": len(classes), "skipped": skipped}


def read_split(root: str, split: str):
    """(dataset of (image bytes, label), (n, 2) sizes) of root/<split>.mindrecord."""
    import mindspore.dataset as ds

    path = os.path.join(root, f"{split}.mindrecord")
    if not os.path.isfile(path) or not os.path.isfile(path + ".db"):
        raise DataError(
            f"data.root {root!r} lacks {split}.mindrecord (and its .db index): write them with "
            "`python -m runner.datasets.mindrecord <image folder> <dir>`."
        )
    try:
        sizes = ds.MindDataset(path, columns_list=["height", "width"], shuffle=False)
        hw = [(int(h), int(w)) for h, w in sizes.create_tuple_iterator(num_epochs=1, output_numpy=True)]
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:200]
        raise DataError(f"{path!r} cannot be read as the runner's MindRecord ({detail}).") from None
    return ds.MindDataset(path, columns_list=["image", "label"], shuffle=False), np.array(hw, np.int64).reshape(-1, 2)


def read_classes(root: str) -> list:
    """The class names classes.json lists, in label order."""
    path = os.path.join(root, CLASSES)
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
