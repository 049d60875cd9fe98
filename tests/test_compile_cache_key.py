"""The compile cache's key against what a graph holds: every setting the key leaves out (NOT_IN_GRAPH) and
every environment switch, changed after a run filled the cache, either misses or trains bit for bit as the
same run with the cache off; the built cells' constants (graph_constants) hold what the config bakes in.
CLI runs are subprocesses (in a pytest-xdist worker MindSpore has no entry script and the cache is off)."""

import shutil

import pytest
from conftest import TINY, compose_cfg, metrics, run_cli

from runner.training import compile_cache

# What each left-out setting is changed to. The base run is TINY with the cache in a directory of the test's
# own. HITS must be handed the cached graphs; changed all at once (one run, not one per setting: each run is
# ~20 s on 2 cores) their loss curve must equal the same run's with the cache off bit for bit. MISSES must
# compile their own graphs.
HITS = {
    "experiment_name": ["experiment_name=other"],
    "logger": ["logger.csv=null"],
    "save_checkpoint": ["save_checkpoint=false"],
    "checkpoint": ["checkpoint.keep_last=1", "checkpoint.top_k=2"],
    "init_from": ["init_from={base}"],  # other initial weights: Parameters, not constants
    "profile": ["profile.steps=2"],
    "log_every": ["log_every=3"],
    "early_stop": ["early_stop.patience=5"],
    "validation": ["validation.every_epochs=1"],
    # The runner's ResNet holds no seeded primitive: the seed moves the weights and the data order only.
    "seed": ["seed=1"],
    # The default schedule's floor is 0: min_lr/lr is 0 whatever lr is, and lr is the schedule's Parameter.
    "optim.lr": ["optim.lr=0.05"],
    "data.num_parallel_workers": ["data.num_parallel_workers=1"],
    "augment": ["augment.crop_padding=1"],
}
MISSES = {
    "compile_cache": (["compile_cache.dir={other}"], {}),
    "data.val_fraction": (["data.val_fraction=0.3"], {}),  # other steps per epoch, validation set
    # Settings that change the operators, and the environment's switch of the ISA the graphs were compiled for.
    "model.blocked_body": (["model.blocked_body=false"], {}),
    "model.blocked_layers": (["model.blocked_layers=onednn"], {}),
    "ONEDNN_MAX_CPU_ISA": ([], {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
}
# Left-out settings no changed run can show, and why.
NO_GRAPH_TO_SHOW = {
    "dry_run": "a dry run compiles nothing",
    "resume": "a resume compiles the sequence its own key names (test_compile_cache.py: a resume that only reports)",
    "ladder": "the tuning ladder is a sweep; each rung is a run whose settings are in the key",
}
# Left-out settings the base run's data set (digits) refuses: tried on a data set that takes them, whose own
# first run fills a cache of its own. "{a}" and "{b}": two copies of one image folder.
FOLDER = ["data=imagefolder", "data.channels=1", "data.mean=[0.5]", "data.std=[0.5]", "data.root={a}"]
SYNTHETIC = ["data=synthetic", "data.channels=1", "data.mean=[0.5]", "data.std=[0.5]", "data.image_size=8"]
# data.root: the same images elsewhere (the graph reads no path); both hits changed in one run, as HITS are.
OWN_DATA = {
    "data.root+data.on_bad_sample": (FOLDER, ["data.root={b}", "data.on_bad_sample=skip"], "hit"),
    "data.num_samples": ([*SYNTHETIC, "data.num_samples=128"], ["data.num_samples=256"], "miss"),  # more steps
}
# The schedule's floor is a constant of the graph: lr then changes it (the finding that made this test).
FLOOR = ["optim.min_lr=0.04", "optim.lr=0.4"]


def test_every_left_out_setting_and_switch_is_tried():
    tried = set(HITS) | set(MISSES) | set(NO_GRAPH_TO_SHOW) | {k for name in OWN_DATA for k in name.split("+")}
    assert set(compile_cache.NOT_IN_GRAPH) <= tried


def _run(where, cache, *overrides, env=None):
    """A TINY run with the cache in `cache` (None: the cache off)."""
    place = [f"compile_cache.dir={cache}"] if cache else ["compile_cache.enabled=false"]
    run_cli(where, *TINY, *place, *overrides, env=env)
    return metrics(where)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """(cache dir, base run dir) after the base run and the floor's base run filled the cache."""
    root = tmp_path_factory.mktemp("cache-key")
    cache = root / "cache"
    base = _run(root / "base", cache)
    floor = _run(root / "floor", cache, *FLOOR)
    assert base["compile_cache"]["state"] == "miss" and floor["compile_cache"]["state"] == "miss"
    return cache, root / "base"


def _same_or_miss(tmp_path, cache, overrides, env, expect):
    on = _run(tmp_path / "on", cache, *overrides, env=env)
    assert on["compile_cache"]["state"] == expect, on["compile_cache"]
    if expect == "hit":  # handed the cached graphs: they must compute what this run's own would
        off = _run(tmp_path / "off", None, *overrides, env=env)
        assert off["compile_cache"]["state"] == "off"
        assert on["loss_curve"] == off["loss_curve"] and on["val_loss"] == off["val_loss"]


@pytest.mark.slow
def test_the_left_out_settings_changed_together_train_as_without_the_cache(filled, tmp_path):
    cache, base = filled
    overrides = [o.format(base=base) for change in HITS.values() for o in change]
    _same_or_miss(tmp_path, cache, overrides, None, "hit")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MISSES))
def test_a_left_out_setting_that_changes_the_graph_misses(filled, tmp_path, name):
    cache, _ = filled
    overrides, env = MISSES[name]
    other = tmp_path / "other-cache"
    _same_or_miss(tmp_path, cache, [o.format(other=other) for o in overrides], env or None, "miss")


@pytest.mark.slow
def test_lr_under_a_schedule_floor_misses(filled, tmp_path):
    # cosine's min_lr/lr is a constant of the train graph: lr=0.05 must not be handed lr=0.4's graph.
    _same_or_miss(tmp_path, filled[0], ["optim.min_lr=0.04", "optim.lr=0.05"], None, "miss")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OWN_DATA))
def test_a_left_out_data_setting_changed_misses_or_trains_as_without_the_cache(tmp_path, name):
    from imagegen import digit_folder

    base, change, expect = OWN_DATA[name]
    folders = {"a": tmp_path / "data-a", "b": tmp_path / "data-b"}
    digit_folder(folders["a"], [(8, 8)], per_class=6, val_per_class=2)
    shutil.copytree(folders["a"], folders["b"])
    base = [o.format(**folders) for o in base]
    cache = tmp_path / "cache"
    assert _run(tmp_path / "base", cache, *base)["compile_cache"]["state"] == "miss"
    _same_or_miss(tmp_path, cache, [*base, *(o.format(**folders) for o in change)], None, expect)


def _constants(net, *more):
    return compile_cache.graph_constants(net, *more)


def test_the_built_cells_constants_hold_what_the_config_bakes_in():
    import mindspore as ms
    from mindspore import nn

    from runner.models.resnet import resnet

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    # Two builds of one config: the same constants (the key is stable across processes and builds).
    assert _constants(resnet("cifar", 8, 8, 10, 1, 8, conv="native")) == _constants(
        resnet("cifar", 8, 8, 10, 1, 8, conv="native")
    )
    # A layer's chosen algorithm (conv-paths.json's choice) is one of its cell's constants.
    a, b = resnet("cifar", 8, 8, 10, 1, 8, conv="native"), resnet("cifar", 8, 8, 10, 1, 8, conv="native")
    b.layer1[0].conv1.path = "gemm"
    assert _constants(a) != _constants(b)
    # A schedule's floor relative to lr, and a Dropout's seeds (the run's seed), are constants too.
    assert _constants(nn.CosineDecayLR(0.1, 1.0, 10)) != _constants(nn.CosineDecayLR(0.8, 1.0, 10))
    seeded = []
    for seed in (1, 2):
        ms.set_seed(seed)
        seeded.append(_constants(nn.Dropout(p=0.5)))
    assert seeded[0] != seeded[1] and compile_cache.holds_seeds(seeded[0])
    assert not compile_cache.holds_seeds(_constants(a))


def test_a_zoo_model_keys_on_the_seed():
    # A MindCV model's construct may call a random function that bakes the seed into the graph.
    place = {"purpose": "train", "graphs": [], "target": "CPU", "rank": 0, "world": 1, "conv": "native", "isa": ""}
    zoo = [compile_cache.key(compose_cfg(*TINY, "model=mindcv", f"seed={s}"), **place) for s in (0, 1)]
    own = [compile_cache.key(compose_cfg(*TINY, f"seed={s}"), **place) for s in (0, 1)]
    assert zoo[0] != zoo[1] and own[0] == own[1]


def test_a_cache_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert "writable by other users" in compile_cache.unsafe_reason(shared)
    shared.chmod(0o700)
    assert compile_cache.unsafe_reason(shared) is None
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # no sticky bit: anyone could replace what is inside
    (loose / "cache").mkdir(mode=0o700)
    assert "sticky" in compile_cache.unsafe_reason(loose / "cache")
