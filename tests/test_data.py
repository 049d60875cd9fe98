"""The data sources (digits, synthetic, imagefolder, cifar10, cifar100, mnist) through build_data, on made files."""

import numpy as np
import pytest
from conftest import batches, build, metrics, run_in_process, word_digit_folder
from imagegen import fake_cifar10, fake_cifar100, fake_mnist, solid_folder

from runner.datasets import DataError

# Identity normalization: pipeline outputs are pixel / 255, easy to compare with what was written.
RAW3 = ["data.mean=[0,0,0]", "data.std=[1,1,1]"]
RAW1 = ["data.channels=1", "data.mean=[0]", "data.std=[1]"]


def test_digits_split_and_shapes():
    data = build("data=digits", "batch_size=32", "padding.height=8", "padding.width=8")
    assert (data.train_size, data.val_size) == (1797 - 359, 359)
    assert data.steps_per_epoch == data.train.get_dataset_size() == 1438 // 32
    x, y = batches(data.train)[0]
    assert x.shape == (32, 1, 8, 8) and x.dtype == np.float32 and y.dtype == np.int32


def test_synthetic_options_take_effect_and_follow_the_seed():
    opts = ["data=synthetic", "data.num_samples=40", "data.image_size=12", "data.num_classes=3", "batch_size=8"]
    data = build(*opts, "padding.height=12", "padding.width=12", "data.val_fraction=0.25")
    assert (data.train_size, data.val_size, data.num_classes) == (30, 10, 3)
    x, y = batches(data.train)[0]
    assert x.shape == (8, 3, 12, 12) and set(y) <= {0, 1, 2}
    again = batches(build(*opts, "padding.height=12", "padding.width=12", "data.val_fraction=0.25").train)[0][0]
    other = batches(build(*opts, "padding.height=12", "padding.width=12", "data.val_fraction=0.25", "seed=1").train)
    assert np.array_equal(x, again) and not np.array_equal(x, other[0][0])


def test_imagefolder_mixed_channels_and_labels(tmp_path):
    # Every class has one value; grayscale, RGB and RGBA files of each, at different sizes.
    files = []
    for split in ("train", "val"):
        for k, cls in enumerate(["ant", "bee", "cat"]):
            for j, mode in enumerate(["L", "RGB", "RGBA"]):
                files.append((split, cls, f"{j}.png", mode, 5 + 3 * j, 9 - 2 * j, 40 + 60 * k))
    solid_folder(tmp_path, files)
    (tmp_path / "train" / "ant" / "notes.txt").write_text("not an image: skipped by extension")
    for channels, extra in ((3, RAW3), (1, RAW1)):
        data = build(
            "data=imagefolder", f"data.root={tmp_path}", "batch_size=3", "padding.height=6", "padding.width=6", *extra
        )
        assert (data.num_classes, data.train_size, data.val_size) == (3, 9, 9)
        for split in (data.train, data.val):
            for x, y in batches(split):
                assert x.shape[1:] == (channels, 6, 6)
                # resize of a constant image is that constant: the label must match the value.
                assert np.allclose(x * 255, (40 + 60 * y)[:, None, None, None], atol=1)


def test_imagefolder_mistakes_name_the_culprit(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        build("data=imagefolder", f"data.root={tmp_path / 'nope'}")
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match="val/"):
        build("data=imagefolder", f"data.root={tmp_path}")
    (tmp_path / "val").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        build("data=imagefolder", f"data.root={tmp_path}")
    solid_folder(tmp_path, [("train", "a", "0.png", "L", 4, 4, 9), ("val", "b", "0.png", "L", 4, 4, 9)])
    with pytest.raises(DataError, match=r"\['b'\]"):
        build("data=imagefolder", f"data.root={tmp_path}")
    (tmp_path / "val" / "b" / "0.png").unlink()
    (tmp_path / "val" / "b").rmdir()
    (tmp_path / "train" / "a" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match="broken.png"):
        build("data=imagefolder", f"data.root={tmp_path}")


def test_cifar10_binary_records(tmp_path):
    train_labels, test_labels = fake_cifar10(tmp_path, per_file=4, test_records=6)
    data = build(
        "data=cifar10", f"data.root={tmp_path}", "batch_size=4", "padding.height=32", "padding.width=32", *RAW3
    )
    assert (data.train_size, data.val_size, data.num_classes) == (20, 6, 10)
    assert data.padding["input_sizes"] == {"32x32": 20}
    seen = []
    rows, cols = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    for x, y in batches(data.val):
        px = np.rint(x * 255).astype(int)
        for img, label in zip(px, y):
            # R encodes label and row, G the column: channel order and orientation survive the pipeline.
            assert np.array_equal(img[0], label * 20 + rows) and np.array_equal(img[1], 100 + cols)
            assert (img[2] == 200).all()
            seen.append(label)
    assert seen == list(test_labels)
    assert sorted(y for _, ys in batches(data.train) for y in ys) == sorted(train_labels)


def test_cifar10_missing_files(tmp_path):
    fake_cifar10(tmp_path, per_file=1, test_records=1)
    (tmp_path / "test_batch.bin").unlink()
    with pytest.raises(DataError, match="test_batch.bin"):
        build("data=cifar10", f"data.root={tmp_path}")


def test_cifar100_fine_labels_and_names(tmp_path):
    train_labels, test_labels = fake_cifar100(tmp_path, train_records=12, test_records=5)
    data = build(
        "data=cifar100", f"data.root={tmp_path}", "batch_size=4", "padding.height=32", "padding.width=32", *RAW3
    )
    assert (data.train_size, data.val_size, data.num_classes) == (12, 5, 100)
    assert data.class_names[:2] == ["class00", "class01"] and len(data.class_names) == 100
    rows, cols = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    seen = []
    for x, y in batches(data.val):
        for img, label in zip(np.rint(x * 255).astype(int), y):
            # The fine label is the one read (R), the coarse one only went into B: the right byte is the label.
            assert np.array_equal(img[0], label + rows) and np.array_equal(img[1], 100 + cols)
            assert (img[2] == 200 - label // 5).all()
            seen.append(label)
    assert seen == list(test_labels)
    assert sorted(y for _, ys in batches(data.train) for y in ys) == sorted(train_labels)


def test_cifar100_refuses_what_is_not_cifar100(tmp_path):
    fake_cifar100(tmp_path, train_records=2, test_records=1)
    (tmp_path / "test.bin").write_bytes(b"x" * 100)
    with pytest.raises(DataError, match="is not CIFAR-100 binary data"):
        build("data=cifar100", f"data.root={tmp_path}")
    (tmp_path / "test.bin").unlink()
    with pytest.raises(DataError, match=r"lacks CIFAR-100 binary files \['test.bin'\]"):
        build("data=cifar100", f"data.root={tmp_path}")


def test_mnist_through_mindspores_reader(tmp_path):
    train_labels, test_labels = fake_mnist(tmp_path, train_images=10, test_images=6)
    data = build("data=mnist", f"data.root={tmp_path}", "batch_size=5", "padding.height=28", "padding.width=28", *RAW1)
    assert (data.train_size, data.val_size, data.num_classes, data.channels) == (10, 6, 10, 1)
    rows, cols = np.meshgrid(np.arange(28), np.arange(28), indexing="ij")
    seen = []
    for x, y in batches(data.val):
        assert x.shape[1:] == (1, 28, 28) and y.dtype == np.int32
        for img, label in zip(np.rint(x * 255).astype(int), y):
            assert np.array_equal(img[0], label * 10 + rows + cols)
            seen.append(label)
    assert seen == list(test_labels)
    assert sorted(y for _, ys in batches(data.train) for y in ys) == sorted(train_labels)


@pytest.mark.slow  # four trainings with a graph compile each: ~50 s each on a loaded 2-core machine
def test_mnist_cifar100_csv_and_mindrecord_train_through_the_command_line(tmp_path):
    fake_mnist(tmp_path / "mnist", train_images=24, test_images=8)
    fake_cifar100(tmp_path / "cifar100", train_records=24, test_records=8)
    paths = _flat_images(tmp_path / "csv", list(range(0, 256, 8))[:32])
    (tmp_path / "csv" / "train.csv").write_text("".join(f"{p},{i % 3}\n" for i, p in enumerate(paths[:24])))
    (tmp_path / "csv" / "val.csv").write_text("".join(f"{p},{i % 3}\n" for i, p in enumerate(paths[24:])))
    tiny = ["epochs=1", "batch_size=8", "model.width=8", "log_every=1000", "padding.height=8", "padding.width=8"]
    from runner.datasets.mindrecord import convert

    convert(str(word_digit_folder(tmp_path / "folder", per_class=3, val_per_class=1)), str(tmp_path / "mindrecord"))
    for source in ("mnist", "cifar100", "csv", "mindrecord"):
        run_in_process(tmp_path / f"run_{source}", f"data={source}", f"data.root={tmp_path / source}", *tiny)
        m = metrics(tmp_path / f"run_{source}")
        expected = (30, 10, 3) if source == "mindrecord" else (24, 8, 3)
        assert (m["train_samples"], m["val_samples"], m["steps"]) == expected, source
        assert m["val_accuracy"] is not None


def test_mnist_refuses_missing_and_broken_files(tmp_path):
    fake_mnist(tmp_path, train_images=2, test_images=2)
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"\0\0\0\0broken")
    with pytest.raises(DataError, match="cannot be read by MindSpore's MnistDataset"):
        build("data=mnist", f"data.root={tmp_path}")
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="gunzip"):
        build("data=mnist", f"data.root={tmp_path}")


def _flat_images(root, values):
    """root/img/<i>.png, a gray 6x(4+i) image of value values[i] each; returns their relative paths."""
    from PIL import Image

    (root / "img").mkdir(parents=True, exist_ok=True)
    paths = []
    for i, v in enumerate(values):
        Image.fromarray(np.full((6, 4 + i), v, np.uint8)).save(root / "img" / f"{i}.png")
        paths.append(f"img/{i}.png")
    return paths


def test_a_csv_list_of_paths_and_class_names(tmp_path):
    paths = _flat_images(tmp_path, [10, 20, 30, 40, 50, 60])
    # Names, a header row, a blank line; the classes are indexed in sorted order (cat 0, dog 1).
    (tmp_path / "train.csv").write_text(
        f"path,label\n{paths[0]},dog\n{paths[1]},cat\n\n{paths[2]},dog\n{paths[3]},cat\n"
    )
    (tmp_path / "val.csv").write_text(f"{paths[4]},cat\n{tmp_path / paths[5]},dog\n")  # an absolute path too
    data = build("data=csv", f"data.root={tmp_path}", "batch_size=2", "padding.height=6", "padding.width=6", *RAW1)
    assert (data.train_size, data.val_size, data.num_classes, data.class_names) == (4, 2, 2, ["cat", "dog"])
    assert data.padding["input_sizes"] == {"6x6": 4}
    val = [(int(round(x[0, 0, 0] * 255)), int(y)) for xs, ys in batches(data.val) for x, y in zip(xs, ys)]
    assert val == [(50, 0), (60, 1)]  # each file with its own label, in the list's order
    train = sorted((int(round(x[0, 0, 0] * 255)), int(y)) for xs, ys in batches(data.train) for x, y in zip(xs, ys))
    assert train == [(10, 1), (20, 0), (30, 1), (40, 0)]


def test_a_csv_list_with_integer_labels_and_its_mistakes(tmp_path):
    paths = _flat_images(tmp_path, [10, 20, 30])
    (tmp_path / "train.csv").write_text(f"{paths[0]},0\n{paths[1]},2\n")
    (tmp_path / "val.csv").write_text(f"{paths[2]},02\n")
    data = build("data=csv", f"data.root={tmp_path}", "batch_size=1", "padding.height=6", "padding.width=6", *RAW1)
    assert data.num_classes == 3 and [int(y) for _, ys in batches(data.val) for y in ys] == [2]
    (tmp_path / "val.csv").write_text(f"{paths[2]},2,extra\n")
    with pytest.raises(DataError, match=r"val.csv:1: expected `path,label`"):
        build("data=csv", f"data.root={tmp_path}")
    (tmp_path / "val.csv").write_text(f"{paths[2]},2\nimg/missing.png,0\n")
    with pytest.raises(DataError, match="missing.png"):
        build("data=csv", f"data.root={tmp_path}")
    skipped = build("data=csv", f"data.root={tmp_path}", "data.on_bad_sample=skip", "batch_size=1", *RAW1)
    assert skipped.val_size == 1 and skipped.skipped_samples == [str(tmp_path / "img" / "missing.png")]
    (tmp_path / "train.csv").write_text(f"{paths[0]},cat\n")
    (tmp_path / "val.csv").write_text(f"{paths[2]},dog\n")
    with pytest.raises(DataError, match=r"val.csv has labels that train.csv lacks: \['dog'\]"):
        build("data=csv", f"data.root={tmp_path}")


@pytest.mark.parametrize(
    "train, val, row, says",
    [
        (["0", "1", "\u0663"], ["1"], "train.csv:3", "digits of another script (int() reads '\u0663' as 3; write 3)"),
        (["0", "1", "2"], ["cat"], "val.csv:1", "the label 'cat' is a class name"),
        (["cat", "dog", "7"], ["cat"], "train.csv:3", "the label '7' is a class index"),
    ],
)
def test_a_csv_list_that_mixes_indices_and_names_is_refused_with_the_row(tmp_path, train, val, row, says):
    paths = _flat_images(tmp_path, [10] * (len(train) + len(val)))
    (tmp_path / "train.csv").write_text("".join(f"{p},{lb}\n" for p, lb in zip(paths, train)))
    (tmp_path / "val.csv").write_text("".join(f"{p},{lb}\n" for p, lb in zip(paths[len(train) :], val)))
    with pytest.raises(DataError) as e:
        build("data=csv", f"data.root={tmp_path}")
    message = str(e.value)
    assert f"{tmp_path / row.split(':')[0]}:{row.split(':')[1]}:" in message and says in message, message
    assert "Fix that row" in message


def test_an_image_folder_converted_to_mindrecord_reads_back_the_same(tmp_path, capsys):
    from imagegen import digit_folder

    from runner.datasets.mindrecord import main

    digit_folder(tmp_path / "folder", [(12, 12), (10, 14)], per_class=4, classes=3, val_per_class=2)
    assert main([str(tmp_path / "folder"), str(tmp_path / "mr")]) == 0
    assert "12 training and 6 validation images of 3 classes" in capsys.readouterr().out
    common = ["batch_size=2", "padding.height=12", "padding.width=12", *RAW3]
    folder = build("data=imagefolder", f"data.root={tmp_path / 'folder'}", *common)
    mr = build("data=mindrecord", f"data.root={tmp_path / 'mr'}", *common)
    assert (mr.train_size, mr.val_size, mr.num_classes, mr.class_names) == (12, 6, 3, folder.class_names)
    assert mr.padding == folder.padding  # the sizes stored in the records, without decoding
    for (xa, ya), (xb, yb) in zip(batches(folder.val), batches(mr.val)):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)  # the same bytes, decoded by the same Decode


def test_mindrecord_command_and_reader_refuse_with_one_paragraph(tmp_path, capsys):
    from runner.datasets.mindrecord import main

    assert main([str(tmp_path / "nowhere"), str(tmp_path / "mr")]) == 2
    assert "Error: the image folder" in capsys.readouterr().err
    assert main(["only-one"]) == 2 and "usage: python -m runner.datasets.mindrecord" in capsys.readouterr().err
    (tmp_path / "mr").mkdir()
    (tmp_path / "mr" / "classes.json").write_text('["a", "b"]')
    with pytest.raises(DataError, match="lacks train.mindrecord .*python -m runner.datasets.mindrecord"):
        build("data=mindrecord", f"data.root={tmp_path / 'mr'}")


def _truncated_folder(root):
    from imagegen import digit_folder

    digit_folder(root, [(12, 12), (10, 14)], per_class=8, classes=3, val_per_class=2)
    victim = root / "train" / "1" / "1_3.png"
    victim.write_bytes(victim.read_bytes()[:60])  # a valid header, then nothing: truncated
    return victim


def test_bad_image_is_an_error_naming_the_file(tmp_path):
    _truncated_folder(tmp_path)
    with pytest.raises(DataError, match=r"1_3.png.*on_bad_sample=skip"):
        build("data=imagefolder", f"data.root={tmp_path}")


def test_empty_class_folder_is_named(tmp_path):
    _truncated_folder(tmp_path)
    (tmp_path / "train" / "9").mkdir()
    with pytest.raises(DataError, match=r"no images.*\['9'\]"):
        build("data=imagefolder", f"data.root={tmp_path}", "data.on_bad_sample=skip")


@pytest.mark.slow
def test_skip_bad_samples_trains_and_reports_them(tmp_path, tiny):
    from conftest import metrics

    victim = _truncated_folder(tmp_path / "data")
    run_in_process(
        tmp_path / "run",
        "data=imagefolder",
        f"data.root={tmp_path / 'data'}",
        "data.on_bad_sample=skip",
        "batch_size=4",
        *tiny,
    )
    m = metrics(tmp_path / "run")
    assert m["skipped_samples"] == [str(victim)]
    assert m["train_samples"] == 23 and m["final_loss"] > 0


def test_the_digits_read_from_scikit_learns_file_are_load_digits_own():
    # Read without importing scikit-learn (2.6 s of every digits run): the same images and labels, in order.
    from sklearn.datasets import load_digits

    from runner.datasets.sources import digits_arrays

    images, labels = digits_arrays()
    d = load_digits()
    assert np.array_equal(images, d.images) and np.array_equal(labels, d.target) and images.shape == (1797, 8, 8)
