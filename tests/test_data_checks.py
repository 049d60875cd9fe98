"""What every data reader and the MindRecord converter refuse (docs/data-checks.md): non-regular files,
labels outside the classes, validation classes training lacks, an output folder that is not theirs, and images
removed while a run reads them."""

import os
import signal
import struct
from contextlib import contextmanager

import pytest
from conftest import build
from imagegen import digit_folder, fake_mnist

from runner.datasets import DataError
from runner.datasets.mindrecord import main as convert_main

SMALL = ["batch_size=2", "padding.height=12", "padding.width=12"]


@contextmanager
def deadline(seconds: int):
    """Fail instead of hanging: a reader that opens a FIFO blocks forever in open()."""

    def expired(signum, frame):
        raise AssertionError(f"still running after {seconds} s: a FIFO was opened")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _folder(root):
    digit_folder(root, [(12, 12)], per_class=3, classes=2, val_per_class=2)
    return root


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_fifo_named_png_is_never_opened_by_any_reader(tmp_path, capsys):
    root = _folder(tmp_path / "folder")
    fifo = root / "train" / "1" / "zz.png"
    os.mkfifo(fifo)
    (root / "train.csv").write_text("".join(f"{p.relative_to(root)},{p.parent.name}\n" for p in root.glob("train/*/*")))
    (root / "val.csv").write_text("".join(f"{p.relative_to(root)},{p.parent.name}\n" for p in root.glob("val/*/*")))
    with deadline(60):
        for source in ("imagefolder", "csv"):
            with pytest.raises(DataError, match=r"zz.png.*not a regular file \(a FIFO\)"):
                build(f"data={source}", f"data.root={root}", *SMALL)
            data = build(f"data={source}", f"data.root={root}", "data.on_bad_sample=skip", *SMALL)
            assert data.skipped_samples == [str(fifo)] and data.train_size == 6, source
        assert convert_main([str(root), str(tmp_path / "mr")]) == 2
        err = capsys.readouterr().err
        assert "zz.png" in err and "a FIFO" in err and not (tmp_path / "mr").exists()
        assert convert_main([str(root), str(tmp_path / "mr"), "--skip-bad"]) == 0
        assert "1 unreadable file(s) left out" in capsys.readouterr().out
        # A FIFO where a reader expects its list or class file is refused by name too.
        os.replace(tmp_path / "mr" / "classes.json", tmp_path / "classes.json")
        os.mkfifo(tmp_path / "mr" / "classes.json")
        with pytest.raises(DataError, match=r"classes.json.*a FIFO"):
            build("data=mindrecord", f"data.root={tmp_path / 'mr'}", *SMALL)
        (root / "val.csv").unlink()
        os.mkfifo(root / "val.csv")
        with pytest.raises(DataError, match=r"val.csv.*a FIFO"):
            build("data=csv", f"data.root={root}", *SMALL)


def test_the_converter_checks_every_image_before_it_writes(tmp_path, capsys):
    root = _folder(tmp_path / "folder")
    out = tmp_path / "mr"
    assert convert_main([str(root), str(out)]) == 0
    before = _snapshot(out)
    assert "conversion.json" in before
    # A second conversion of a changed folder replaces a finished one whole...
    digit_folder(root, [(12, 12)], per_class=4, classes=2, val_per_class=2)
    assert convert_main([str(root), str(out)]) == 0
    assert "8 training and 4 validation images" in capsys.readouterr().out
    after = _snapshot(out)
    # ...but a corrupt image, in the last split read, stops it before a single byte is written.
    victim = root / "val" / "0" / "0_0.png"
    victim.write_bytes(victim.read_bytes()[:60])
    assert convert_main([str(root), str(out)]) == 2
    err = capsys.readouterr().err
    assert "0_0.png" in err and "--skip-bad" in err and "on_bad_sample" not in err
    assert _snapshot(out) == after and after != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "mr"]  # no temporary folder left behind
    assert build("data=mindrecord", f"data.root={out}", *SMALL).train_size == 8


def test_the_converter_refuses_an_output_that_is_not_its_own(tmp_path, capsys):
    root = _folder(tmp_path / "folder")
    out = tmp_path / "out"
    out.mkdir()
    (out / "classes.json").write_text('["mine"]')  # files of someone else's, or of an unfinished conversion
    assert convert_main([str(root), str(out)]) == 2
    assert "not a finished conversion" in capsys.readouterr().err
    assert (out / "classes.json").read_text() == '["mine"]' and len(list(out.iterdir())) == 1
    (tmp_path / "file").write_text("keep")
    assert convert_main([str(root), str(tmp_path / "file")]) == 2
    assert "is an existing file" in capsys.readouterr().err and (tmp_path / "file").read_text() == "keep"
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    assert convert_main([str(root), str(tmp_path / "link")]) == 2
    assert "symbolic link" in capsys.readouterr().err and not list((tmp_path / "elsewhere").iterdir())
    # A finished conversion with a file added to it is not the converter's alone any more.
    assert convert_main([str(root), str(tmp_path / "mr")]) == 0
    (tmp_path / "mr" / "notes.txt").write_text("mine")
    assert convert_main([str(root), str(tmp_path / "mr")]) == 2
    assert "notes.txt" in capsys.readouterr().err and (tmp_path / "mr" / "notes.txt").exists()


def test_a_validation_class_training_lacks_is_refused_by_every_reader(tmp_path, capsys):
    root = _folder(tmp_path / "folder")
    digit_folder(tmp_path / "z", [(12, 12)], per_class=2, classes=1)
    os.rename(tmp_path / "z" / "train" / "0", root / "val" / "z")
    with pytest.raises(DataError, match=r"class folders that train/ lacks: \['z'\]"):
        build("data=imagefolder", f"data.root={root}", *SMALL)
    assert convert_main([str(root), str(tmp_path / "mr")]) == 2
    assert "train/ lacks: ['z']" in capsys.readouterr().err and not (tmp_path / "mr").exists()
    (root / "train.csv").write_text("train/0/0_0.png,0\ntrain/1/1_0.png,1\n")
    (root / "val.csv").write_text("val/0/0_0.png,0\nval/z/0_0.png,2\n")
    with pytest.raises(DataError, match=r"val.csv has labels that train.csv lacks: \[2\]"):
        build("data=csv", f"data.root={root}", *SMALL)


def test_csv_lists_with_a_byte_order_mark_and_odd_labels(tmp_path):
    root = _folder(tmp_path)
    rows = lambda split: "".join(f"{p.relative_to(root)},{p.parent.name}\n" for p in sorted(root.glob(f"{split}/*/*")))  # noqa: E731
    # Excel's "CSV UTF-8": a BOM before the header; read as text it would make the header a data row.
    (root / "train.csv").write_bytes(b"\xef\xbb\xbfpath,label\n" + rows("train").encode())
    (root / "val.csv").write_bytes(b"\xef\xbb\xbfpath,label\n" + rows("val").encode())
    data = build("data=csv", f"data.root={root}", "data.on_bad_sample=skip", *SMALL)
    assert (data.num_classes, data.train_size, data.skipped_samples) == (2, 6, [])
    (root / "val.csv").write_text(rows("val") + "val/1/1_0.png,\u00b2\n")  # isdigit() is true, int() fails
    with pytest.raises(DataError, match=r"val.csv:\d+: the label '\u00b2' is a class name"):  # among indices
        build("data=csv", f"data.root={root}", *SMALL)
    (root / "train.csv").write_text(rows("train") + "train/1/1_0.png,1000000000000\n")
    (root / "val.csv").write_text(rows("val"))
    with pytest.raises(DataError, match=r"train.csv .* label 1000000000000.*100000"):
        build("data=csv", f"data.root={root}", *SMALL)


def test_labels_beyond_the_classes_are_refused_by_mnist_and_mindrecord(tmp_path):
    fake_mnist(tmp_path / "mnist", train_images=4, test_images=2)
    labels = tmp_path / "mnist" / "t10k-labels-idx1-ubyte"
    labels.write_bytes(struct.pack(">II", 2049, 2) + bytes([3, 10]))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.* has label 10, .* 0\.\.9"):
        build("data=mnist", f"data.root={tmp_path / 'mnist'}")
    root = _folder(tmp_path / "folder")
    assert convert_main([str(root), str(tmp_path / "mr")]) == 0
    (tmp_path / "mr" / "classes.json").write_text('["0"]')  # one class named; the records hold labels 0 and 1
    with pytest.raises(DataError, match=r"train.mindrecord.* has label 1, but its 1 classes are labelled 0\.\.0"):
        build("data=mindrecord", f"data.root={tmp_path / 'mr'}", *SMALL)


def test_a_mindspore_error_is_quoted_with_its_reason(tmp_path):
    out = tmp_path / "mr"
    out.mkdir()
    (out / "classes.json").write_text('["a"]')
    for name in ("train.mindrecord", "train.mindrecord.db"):
        (out / name).write_bytes(b"garbage" * 100)
    with pytest.raises(DataError) as e:
        build("data=mindrecord", f"data.root={out}", *SMALL)
    text = str(e.value)
    assert "mindrecord file header is larger than the upper limit" in text and "C++" not in text
    assert "Exception thrown from dataset pipeline" not in text
    assert "\n" not in text  # one paragraph


@pytest.mark.slow
def test_images_removed_mid_run_end_it_with_one_paragraph_naming_a_file(tmp_path):
    from conftest import start_cli, wait_for, word_digit_folder

    root = word_digit_folder(tmp_path / "data", per_class=12, val_per_class=1)
    run = tmp_path / "run"
    args = ["epochs=300", "padding.height=8", "padding.width=8", "model.width=8", "log_every=1000", "batch_size=16"]
    args += ["data=imagefolder", f"data.root={root}", "data.channels=1", "data.mean=[0.5]", "data.std=[0.5]"]
    proc = start_cli(run, *args)
    try:
        wait_for(proc, lambda: (run / "checkpoints" / "latest.json").exists())
        removed = sorted(root.glob("train/*/*.png"))
        for p in removed:
            p.unlink()
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    text = " ".join(out.split())
    assert proc.returncode == 2, out[-3000:]
    assert "The data changed while the run read it: '" in text and "Traceback" not in text
    named = text.split("The data changed while the run read it: '", 1)[1].split("'", 1)[0]
    assert named in {str(p) for p in removed}
    assert (run / "checkpoints" / "latest.json").exists() and list(run.glob("checkpoints/step_*.ckpt"))
