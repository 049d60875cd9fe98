"""Generated image data for the data and padding tests: PNG folders and a fake CIFAR-10 binary set."""

from pathlib import Path

import numpy as np
from PIL import Image


def digit_folder(root, sizes, per_class, classes=10, val_per_class=0, seed=0):
    """root/{train,val}/<digit>/*.png: scikit-learn digits rendered at the given sizes.

    Files alternate between grayscale (L), RGB (tinted) and RGBA, so one folder mixes channel counts.
    sizes: list of (height, width), taken in turn within each class. Returns the training files' sizes.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    rng = np.random.RandomState(seed)
    drawn = []
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c in range(classes):
            folder = Path(root) / split / str(c)
            folder.mkdir(parents=True, exist_ok=True)
            pool = np.flatnonzero(d.target == c)
            for i in range(n):
                h, w = sizes[i % len(sizes)]
                img = Image.fromarray(np.clip(d.images[rng.choice(pool)] * 16, 0, 255).astype(np.uint8))
                img = img.resize((w, h), Image.BILINEAR)
                if i % 3 == 1:
                    tint = rng.uniform(0.6, 1.0, 3)
                    img = Image.fromarray((np.asarray(img)[..., None] * tint).astype(np.uint8), "RGB")
                elif i % 3 == 2:
                    img = img.convert("RGBA")
                img.save(folder / f"{c}_{i}.png")
                if split == "train":
                    drawn.append((h, w))
    return drawn


def solid_folder(root, files):
    """root/{train,val}/<class>/*.png from (split, class, name, mode, height, width, value) tuples."""
    for split, cls, name, mode, h, w, value in files:
        folder = Path(root) / split / cls
        folder.mkdir(parents=True, exist_ok=True)
        channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
        arr = np.full((h, w, channels), value, np.uint8)
        if mode == "RGBA":
            arr[..., 3] = 255
        Image.fromarray(arr[..., 0] if channels == 1 else arr, mode).save(folder / name)


def fake_cifar10(root, per_file, test_records, seed=0):
    """CIFAR-10 binary layout: data_batch_1..5.bin and test_batch.bin, records of 1 label byte + 3072
    bytes (R, G, B planes of 32x32, row-major). Pixel (r, c) of a record with label y holds
    R = y * 20 + r, G = 100 + c, B = 200. Returns the labels: (train, test)."""
    rng = np.random.RandomState(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows, cols = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    out = []
    for name, n in [(f"data_batch_{i}.bin", per_file) for i in range(1, 6)] + [("test_batch.bin", test_records)]:
        labels = rng.randint(0, 10, n).astype(np.uint8)
        recs = []
        for y in labels:
            planes = np.stack([y * 20 + rows, 100 + cols, np.full((32, 32), 200)]).astype(np.uint8)
            recs.append(np.concatenate([[y], planes.ravel()]).astype(np.uint8))
        (root / name).write_bytes(np.stack(recs).tobytes())
        out.append(labels)
    return np.concatenate(out[:5]), out[5]


def fake_cifar100(root, train_records, test_records, seed=0, names=True):
    """CIFAR-100 binary layout: train.bin and test.bin, records of a coarse and a fine label byte + 3072
    bytes. Pixel (r, c) of a record with fine label y holds R = y + r, G = 100 + c, B = 200 - coarse label;
    fine_label_names.txt names the classes class00..class99. Returns the fine labels: (train, test)."""
    rng = np.random.RandomState(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows, cols = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    out = []
    for name, n in (("train.bin", train_records), ("test.bin", test_records)):
        fine = rng.randint(0, 100, n).astype(np.uint8)
        recs = []
        for y in fine:
            planes = np.stack([y + rows, 100 + cols, np.full((32, 32), 200 - y // 5)]).astype(np.uint8)
            recs.append(np.concatenate([[y // 5, y], planes.ravel()]).astype(np.uint8))
        (root / name).write_bytes(np.stack(recs).tobytes())
        out.append(fine)
    if names:
        (root / "fine_label_names.txt").write_text("".join(f"class{i:02d}\n" for i in range(100)))
    return out[0], out[1]


def fake_mnist(root, train_images, test_images, seed=0):
    """MNIST idx files (uncompressed): image i of a split holds its label y as pixel (r, c) = y * 10 + r
    + c. Returns the labels: (train, test)."""
    import struct

    rng = np.random.RandomState(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows, cols = np.meshgrid(np.arange(28), np.arange(28), indexing="ij")
    out = []
    for prefix, n in (("train", train_images), ("t10k", test_images)):
        labels = rng.randint(0, 10, n).astype(np.uint8)
        images = np.stack([(y * 10 + rows + cols) for y in labels]).astype(np.uint8)
        (root / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        (root / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())
        out.append(labels)
    return out[0], out[1]


def oversized_png(path, width=20000, height=20000):
    """A PNG whose header claims width x height pixels (400 megapixels by default) and holds no pixel data:
    PIL refuses it at open with DecompressionBombError (over 2x Image.MAX_IMAGE_PIXELS), without allocating."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
