"""The shipped recipes (conf/experiment/): each dry-runs on the command line and trains one tiny epoch
on synthetic data of its channels and classes."""

import subprocess
import sys

import pytest
from conftest import REPO, dry_run, metrics, run_cli, run_in_process

RECIPES = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml") if p.stem not in ("quick", "ladder"))


def _needs(name, tmp_path):
    """What a user must add on the command line: the data, and for fine-tuning the weights.

    A dry run checks that the files and folders the recipe's source reads are there (it opens none), so
    the root gets the layout a download has: CIFAR-10's binary files, or an image folder's splits."""
    if name.startswith("cifar10"):
        for n in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
            (tmp_path / n).write_bytes(b"")
    else:
        for split in ("train", "val"):
            (tmp_path / split).mkdir()
    if name != "finetune_mindcv":
        return [f"data.root={tmp_path}"]
    weights = tmp_path / "weights.ckpt"
    weights.write_bytes(b"")  # the dry run checks that the file exists; it reads nothing
    return [f"data.root={tmp_path}", f"model.checkpoint={weights}"]


def test_the_recipes_are_shipped():
    assert RECIPES == [
        "cifar10_resnet20",
        "cifar10_resnet56",
        "finetune_mindcv",
        "imagenet_resnet18",
        "imagenet_resnet50",
    ]


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.slow
def test_each_recipe_dry_runs(tmp_path, name):
    proc = dry_run(tmp_path / "run", f"+experiment={name}", *_needs(name, tmp_path))
    assert proc.returncode == 0 and "Configuration is valid" in proc.stdout, proc.stderr[-2000:]


def test_a_recipe_without_its_data_is_refused_in_one_paragraph(tmp_path):
    missing = dry_run(tmp_path / "run", "+experiment=imagenet_resnet50")
    assert missing.returncode != 0 and "data.root" in missing.stderr and "Traceback" not in missing.stderr


def test_the_cifar_recipe_is_the_papers():
    from conftest import compose_cfg

    cfg = compose_cfg("experiment=cifar10_resnet56", "data.root=/d")
    assert (cfg.model.name, cfg.data.name, cfg.epochs, cfg.batch_size) == ("resnet56", "cifar10", 164, 128)
    assert (cfg.optim.lr, cfg.optim.momentum, cfg.optim.weight_decay) == (0.1, 0.9, 1e-4)
    assert list(cfg.optim.milestones) == [82, 123] and cfg.optim.schedule == "multistep"
    assert (cfg.augment.crop_padding, cfg.augment.hflip, cfg.padding.height) == (4, True, 32)


@pytest.mark.slow  # five trainings, a MindCV network among them: minutes on 2 cores
@pytest.mark.parametrize("name", RECIPES)
def test_each_recipe_trains_one_tiny_epoch_on_synthetic_data(tmp_path, name):
    small = [
        "data=synthetic",
        "data.num_samples=40",
        "data.num_classes=4",
        "data.image_size=32",
        "data.mirrorable=true",  # the recipes flip; synthetic data is declared not mirrorable
        "epochs=1",
        "batch_size=8",
        "log_every=1000",
        "padding.height=32",
        "padding.width=32",
        "validation.every_epochs=1",
    ]
    if name == "finetune_mindcv":
        # Pretrained weights of a small MindCV network, made and trained on in processes of their own:
        # MindSpore loaded here before the run would hold oneDNN at another CPU ISA than the run sets.
        weights = tmp_path / "pretrained.ckpt"
        make = "import mindcv, mindspore as ms, sys; ms.save_checkpoint(mindcv.create_model(sys.argv[1]), sys.argv[2])"
        subprocess.run([sys.executable, "-c", make, "shufflenet_v2_x0_5", str(weights)], check=True, cwd=REPO)
        run_cli(
            tmp_path / "run",
            f"+experiment={name}",
            *small,
            "model.arch=shufflenet_v2_x0_5",
            f"model.checkpoint={weights}",
        )
    else:
        run_in_process(tmp_path / "run", f"+experiment={name}", *small, "model.width=8", "optim.milestones=[0.5]")
    m = metrics(tmp_path / "run")
    assert m["steps"] == 4 and m["val_accuracy"] is not None and m["augment"]["hflip"] is True
