"""model.conv: the im2col + MatMul and the oneDNN convolutions match nn.Conv2d forward and backward,
checkpoints move between choices, `auto` measures once and then reads its per-machine cache, onednn
builds its library once, and a run says which path its convolutions took."""

import json
import os
import tempfile

import mindspore as ms
import numpy as np
import pytest
from conftest import TINY, compose_cfg, has_compiler, metrics, outputs_of, run_cli, run_in_process, run_module
from conftest import needs_compiler as needs_compiler_mark
from mindspore import Tensor, nn, ops

from runner.models import conv as C
from runner.models.errors import ModelError
from runner.models.onednn import find_compiler
from runner.models.resnet import resnet

pytestmark = pytest.mark.cpu_only  # gemm and onednn exist on CPU only; elsewhere every choice is native


# onednn compiles a C++ library on first use; without a compiler it refuses (tested below), so there is
# nothing else to test.
needs_compiler = needs_compiler_mark()

# (cin, cout, kernel, stride, padding, input side): every kind of convolution the ResNets build.
SHAPES = [
    (3, 4, 3, 1, 1, 6),
    (4, 6, 3, 2, 1, 6),
    (4, 6, 3, 2, 1, 5),  # odd side: the last window is cut by the padding
    (4, 6, 1, 1, 0, 4),
    (4, 6, 1, 2, 0, 6),
    (3, 5, 7, 2, 3, 8),
]


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory):
    """auto's timings and onednn's library go to a directory of this module's, not the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture
def pynative():
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    yield
    ms.set_context(mode=mode)


@pytest.fixture
def graph():
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    yield
    ms.set_context(mode=mode)


def fwd_bwd(cell, x, dy):
    """Output, input gradient and weight gradient for the upstream gradient dy."""
    grads = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)(cell, cell.trainable_params())
    (dx,), (dw,) = grads(x, dy)
    return cell(x).asnumpy(), dx.asnumpy(), dw.asnumpy()


@pytest.mark.parametrize("path", ["gemm", pytest.param("onednn", marks=needs_compiler)])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "{}->{} k{} s{} p{} @{}".format(*s))
def test_each_path_matches_nn_conv2d_forward_and_backward(pynative, shape, path):
    cin, cout, k, s, p, size = shape
    rng = np.random.default_rng(0)
    ref = nn.Conv2d(cin, cout, k, stride=s, pad_mode="pad" if p else "valid", padding=p, has_bias=False)
    alt = C.PathConv2d(cin, cout, k, s, p, path, size)
    alt.weight.set_data(ref.weight.data)
    out = C.conv_output_size(size, k, s, p)
    x = Tensor(rng.standard_normal((2, cin, size, size), dtype=np.float32))
    dy = Tensor(rng.standard_normal((2, cout, out, out), dtype=np.float32))
    for want, got in zip(fwd_bwd(ref, x, dy), fwd_bwd(alt, x, dy)):
        assert want.shape == got.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# Shapes on which every output pixel's window covers the whole input (layer4's 3x3 convs on 2x2 maps).
DENSE_SHAPES = [(4, 6, 3, 1, 1, 2), (5, 3, 3, 1, 1, 1), (4, 6, 1, 1, 0, 1), (3, 4, 5, 1, 2, 3)]


@pytest.mark.parametrize("shape", DENSE_SHAPES, ids=lambda s: "{}->{} k{} s{} p{} @{}".format(*s))
def test_dense_matches_nn_conv2d_forward_and_both_backward_passes(graph, shape):
    cin, cout, k, s, p, size = shape
    assert C.dense_feasible(k, s, p, size)
    rng = np.random.default_rng(3)
    ref = nn.Conv2d(cin, cout, k, stride=s, pad_mode="pad" if p else "valid", padding=p, has_bias=False)
    alt = C.PathConv2d(cin, cout, k, s, p, "dense", size)
    alt.weight.set_data(ref.weight.data)
    x = Tensor(rng.standard_normal((3, cin, size, size), dtype=np.float32))
    dy = Tensor(rng.standard_normal((3, cout, size, size), dtype=np.float32))
    for want, got in zip(fwd_bwd(ref, x, dy), fwd_bwd(alt, x, dy)):
        assert want.shape == got.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dense_only_where_every_window_covers_the_input():
    assert not C.dense_feasible(3, 1, 1, 4)  # 4x4: corner outputs do not see the far corner
    assert not C.dense_feasible(3, 2, 1, 4)  # layer4's strided conv: 4x4 -> 2x2 misses pixels
    assert not C.dense_feasible(1, 2, 0, 4)
    with pytest.raises(ValueError, match="covers the whole input"):
        C.PathConv2d(4, 6, 3, 1, 1, "dense", 4)
    assert C.candidates("best", 3, 1, 1, 2) == ("onednn", "gemm", "dense")
    assert C.candidates("auto", 3, 1, 1, 4) == ("native", "gemm")
    assert C.candidates("best", 3, 1, 1, 8) == ("onednn",)  # 8x8 outputs: oneDNN's, untimed


@needs_compiler
@pytest.mark.parametrize("shape", [(2, 3, 9, 9), (2, 4, 8, 8), (1, 2, 2, 2), (3, 16, 12, 10)], ids=str)
def test_onednn_max_pool_matches_mindspores_forward_and_backward(graph, shape):
    rng = np.random.default_rng(4)
    x = Tensor(rng.standard_normal(shape, dtype=np.float32))  # no ties: the gradient has one place to go
    ref, alt = nn.MaxPool2d(3, stride=2, pad_mode="same"), C.OneDNNMaxPool2d(3, 2)
    want, got = ref(x).asnumpy(), alt(x).asnumpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    dy = Tensor(rng.standard_normal(want.shape, dtype=np.float32))
    grad = ops.GradOperation(sens_param=True)
    np.testing.assert_allclose(grad(alt)(x, dy).asnumpy(), grad(ref)(x, dy).asnumpy(), rtol=1e-6, atol=1e-6)
    # float16 (amp=o2/o3) takes MindSpore's own pool.
    np.testing.assert_array_equal(alt(x.astype(ms.float16)).asnumpy(), ref(x.astype(ms.float16)).asnumpy())


def test_the_stem_pool_follows_the_convolution_path(pynative):
    assert type(C.max_pool(3, 2, "native")) is nn.MaxPool2d
    if has_compiler():
        assert type(C.max_pool(3, 2, "onednn")) is C.OneDNNMaxPool2d


@needs_compiler
def test_best_times_its_candidates_once_per_shape_and_reads_the_cache(pynative, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shape = (8, 8, 3, 1, 1, 2)
    # Too small to be worth timing: oneDNN's, nothing measured.
    assert C.choose_path("best", *shape) == "onednn" and not C.cache_path().exists()
    monkeypatch.setattr(C, "MIN_TIMED_FLOPS", 0)
    chosen = C.choose_path("best", *shape)
    (entries,) = json.loads(C.cache_path().read_text()).values()
    ((key, entry),) = entries.items()
    assert entry["path"] == chosen and set(entry["ms"]) == {"onednn", "gemm", "dense"}
    assert key.endswith("among onednn/gemm/dense")
    cache = {k: {key: {**entry, "path": "dense"}} for k in json.loads(C.cache_path().read_text())}
    C.cache_path().write_text(json.dumps(cache))
    assert C.choose_path("best", *shape) == "dense"
    # auto's choices for the same shape are another entry: different candidates.
    assert C.choose_path("auto", *shape) in ("native", "gemm", "dense")
    assert len(next(iter(json.loads(C.cache_path().read_text()).values()))) == 2


@needs_compiler
def test_onednn_in_graph_mode_on_any_input_size_and_in_float16(graph):
    rng = np.random.default_rng(1)
    ref = C.PathConv2d(4, 6, 3, 2, 1, "native", 6)
    dnn = C.PathConv2d(4, 6, 3, 2, 1, "onednn", 6)
    dnn.weight.set_data(ref.weight.data)
    for size in (6, 9):  # planned for 6; oneDNN primitives are made per input shape, so 9 runs it too
        out = C.conv_output_size(size, 3, 2, 1)
        x = Tensor(rng.standard_normal((3, 4, size, size), dtype=np.float32))
        dy = Tensor(rng.standard_normal((3, 6, out, out), dtype=np.float32))
        for want, got in zip(fwd_bwd(ref, x, dy), fwd_bwd(dnn, x, dy)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # AMP O2/O3 hand it float16 tensors: converted to float32 inside, the result back to float16.
    x = Tensor(rng.standard_normal((2, 4, 6, 6), dtype=np.float32))
    dy = Tensor(rng.standard_normal((2, 6, 3, 3), dtype=np.float32))
    want = fwd_bwd(ref, x, dy)
    got = fwd_bwd(dnn.to_float(ms.float16), x.astype(ms.float16), dy.astype(ms.float16))
    assert got[0].dtype == got[1].dtype == np.float16
    for w, g in zip(want, got):
        np.testing.assert_allclose(g.astype(np.float32), w, rtol=1e-2, atol=2e-2)


@needs_compiler
def test_clearing_the_operator_caches_drops_their_entries_and_the_next_call_rebuilds_them(pynative):
    from runner.models import onednn

    rng = np.random.default_rng(2)
    dnn = C.PathConv2d(4, 6, 3, 1, 1, "onednn", 8)
    x = Tensor(rng.standard_normal((2, 4, 8, 8), dtype=np.float32))
    dy = Tensor(rng.standard_normal((2, 6, 8, 8), dtype=np.float32))
    first = fwd_bwd(dnn, x, dy)
    assert onednn.clear_caches() >= 1  # the shape's convolution primitives
    assert onednn.clear_caches() == 0
    again = fwd_bwd(dnn, x, dy)  # built anew after the clear
    assert onednn.clear_caches() >= 1
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


@needs_compiler
def test_convolutions_of_one_input_shape_and_other_strides_each_get_their_own_output_shape(pynative):
    # PyNative caches a custom operator's inferred shapes by its name and input shapes: without the
    # geometry among its attributes, the stride-2 layer was handed the stride-1 layer's 8x8 output (a
    # ResNet-50 recipe then failed on its first residual add of layer4).
    from runner.models import blocked

    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((1, 8, 8, 8), dtype=np.float32))
    for stride, side in ((1, 8), (2, 4), (1, 8)):
        ref = C.PathConv2d(8, 8, 3, stride, 1, "native", 8)
        dnn = C.PathConv2d(8, 8, 3, stride, 1, "onednn", 8)
        dnn.weight.set_data(ref.weight.data)
        got = dnn(x)
        assert got.shape == (1, 8, side, side)
        np.testing.assert_allclose(got.asnumpy(), ref(x).asnumpy(), rtol=1e-5, atol=1e-5)
    b = blocked.block_size()
    if b:  # the blocked body's convolution and pool infer from their closures likewise
        to, _, like = blocked.converters(8, b)
        xb = to(x, like)
        for stride, side in ((1, 8), (2, 4)):
            op, g = blocked.conv_op(3, stride, 1, b)
            assert op(xb, Tensor(rng.standard_normal((8, 8, 3, 3), dtype=np.float32)), g).shape[2:4] == (side, side)
        for stride, side in ((1, 8), (2, 4)):
            pool, ks = blocked.max_pool_op(3, stride, b)
            assert pool(xb, ks)[0].shape[2:4] == (side, side)


@needs_compiler
@pytest.mark.slow
def test_onednn_builds_its_library_once_and_rebuilds_a_broken_one(tmp_path, monkeypatch):
    from runner.models import onednn

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = onednn.library()
    assert os.path.dirname(first) == str(C.cache_path().parent)
    built = os.stat(first).st_mtime_ns
    assert onednn.library() == first and os.stat(first).st_mtime_ns == built  # found, not rebuilt
    # A file that is not a library under the expected name (a disk that filled up, a stray copy) is
    # rebuilt. In another cache directory: a library this process has loaded stays mapped, whatever the file.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
    broken = C.cache_path().parent / os.path.basename(first)
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"\x7fELF truncated")
    assert onednn.library() == str(broken) and onednn._loads(broken)
    # A cache directory others may write to is not trusted with a library this process will load.
    shared = tmp_path / "shared"
    (shared / "mindspore-runner").mkdir(parents=True)
    (shared / "mindspore-runner").chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    assert not onednn.library().startswith(str(shared)) and not list((shared / "mindspore-runner").iterdir())
    # No compiler: a library built before on this machine serves; with none, one sentence naming the
    # way out, not a compiler traceback.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    assert onednn.library() == first
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "empty"))
    with pytest.raises(ModelError, match="no C\\+\\+ compiler.*model.conv=native or auto"):
        onednn.library()


@needs_compiler
@pytest.mark.slow  # a rebuild of the library: 28 s on 2 cores
def test_a_cached_library_cut_short_is_rebuilt_not_a_crash(tmp_path):
    # dlopen of a library cut short maps segments past the end of the file: the first touch was SIGBUS
    # (exit 135, no message) in every later run. The digest check runs before anything is loaded; in a
    # fresh process, since a library this process has loaded stays mapped whatever the file becomes.
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    code = "from runner.models import onednn; print(onednn.choose().line()); print(onednn.library())"

    def run():
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.splitlines()

    line, built = run()
    assert "runs onednn convolutions" in line
    size = os.path.getsize(built)
    with open(built, "r+b") as f:
        f.truncate(3000)
    line, again = run()
    assert again == built and os.path.getsize(built) == size and "runs onednn convolutions" in line
    # Same bytes, another content (a flipped byte): not the library that was built, so rebuilt too.
    data = bytearray(open(built, "rb").read())
    data[size // 2] ^= 0xFF
    open(built, "wb").write(bytes(data))
    assert run()[1] == built and open(built, "rb").read() != bytes(data)


@needs_compiler
def test_onednn_with_a_cache_home_that_is_a_file_builds_in_a_temporary_directory(tmp_path, monkeypatch):
    import tempfile

    from runner.models import onednn

    (tmp_path / "cache").write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    built = onednn.library()
    assert built.startswith(str(tmp_path / "tmp")) and onednn._loads(built)


@needs_compiler
def test_onednn_build_ignores_compiler_search_variables_and_keys_on_the_compiler(tmp_path, monkeypatch):
    # CPATH and its kin would compile a header of their choosing into a library every later run loads.
    from pathlib import Path

    from runner.models import onednn

    poison = tmp_path / "poison"
    poison.mkdir()
    for header in ("cstdint", "vector", "sched.h"):
        (poison / header).write_text("#error poisoned header\n")
    for var in ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "LIBRARY_PATH"):
        monkeypatch.setenv(var, str(poison))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert onednn._loads(Path(onednn.library()))
    # The key covers what shapes the build: the compiler's file itself (not only its name) and PATH
    # (which finds the assembler and linker).
    dnnl = onednn.mindspore_onednn()
    wrapper = tmp_path / "cxx"
    wrapper.write_text(f'#!/bin/sh\nexec {find_compiler()} "$@"\n')
    wrapper.chmod(0o755)
    key = onednn.build_key(str(wrapper), dnnl)
    wrapper.write_text(f'#!/bin/sh\nexec {find_compiler()} -DOTHER "$@"\n')
    assert onednn.build_key(str(wrapper), dnnl) != key
    key = onednn.build_key(str(wrapper), dnnl)
    monkeypatch.setenv("PATH", f"{poison}:{os.environ['PATH']}")
    assert onednn.build_key(str(wrapper), dnnl) != key


def test_gemm_matches_in_graph_mode_and_on_an_unplanned_size(graph):
    rng = np.random.default_rng(1)
    ref = C.PathConv2d(4, 6, 3, 1, 1, "native", 4)
    gemm = C.PathConv2d(4, 6, 3, 1, 1, "gemm", 4)
    gemm.weight.set_data(ref.weight.data)
    for size in (4, 6):  # 6: built for 4, so this graph runs the native convolution instead
        x = Tensor(rng.standard_normal((3, 4, size, size), dtype=np.float32))
        dy = Tensor(rng.standard_normal((3, 6, size, size), dtype=np.float32))
        for want, got in zip(fwd_bwd(ref, x, dy), fwd_bwd(gemm, x, dy)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gemm_runs_in_float16_as_amp_o2_casts_it(graph):
    rng = np.random.default_rng(3)
    ref = C.PathConv2d(4, 6, 3, 2, 1, "native", 6)
    gemm = C.PathConv2d(4, 6, 3, 2, 1, "gemm", 6)
    gemm.weight.set_data(ref.weight.data)
    x = Tensor(rng.standard_normal((2, 4, 6, 6), dtype=np.float32))
    want = ref(x).asnumpy()
    got = gemm.to_float(ms.float16)(x.astype(ms.float16)).asnumpy()
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("other", ["gemm", pytest.param("onednn", marks=needs_compiler)])
def test_checkpoint_saved_under_one_choice_loads_under_another(pynative, tmp_path, other):
    ms.set_seed(0)
    build = dict(style="cifar", depth=8, width=4, num_classes=3, in_channels=1, image_size=8)
    native, alt = resnet(**build, conv="native"), resnet(**build, conv=other)
    assert [p.name for p in native.get_parameters()] == [p.name for p in alt.get_parameters()]
    assert {c.path for _, c in alt.cells_and_names() if isinstance(c, C.PathConv2d)} == {other}
    path = str(tmp_path / "native.ckpt")
    ms.save_checkpoint(native, path)
    not_loaded, _ = ms.load_param_into_net(alt, ms.load_checkpoint(path), strict_load=True)
    assert not_loaded == []
    native.set_train(False)
    alt.set_train(False)
    x = Tensor(np.random.default_rng(2).standard_normal((2, 1, 8, 8), dtype=np.float32))
    np.testing.assert_allclose(alt(x).asnumpy(), native(x).asnumpy(), rtol=1e-5, atol=1e-5)
    # and back: no extra entries (the im2col matrix, onednn's stride and padding are graph constants)
    ms.save_checkpoint(alt, str(tmp_path / "alt.ckpt"))
    assert set(ms.load_checkpoint(str(tmp_path / "alt.ckpt"))) == set(ms.load_checkpoint(path))


def test_auto_times_once_then_reads_the_cache(pynative, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shape = (4, 6, 3, 1, 1, 4)
    chosen = C.choose_path("auto", *shape)
    cache = json.loads(C.cache_path().read_text())
    (entries,) = cache.values()  # one machine key
    (entry,) = entries.values()
    assert entry["path"] == chosen and set(entry["ms"]) == {"native", "gemm"}
    # A recorded choice is used as is: flip it and the next build follows the file, without timing.
    flipped = "native" if chosen == "gemm" else "gemm"
    entry["path"] = flipped
    C.cache_path().write_text(json.dumps(cache))
    assert C.choose_path("auto", *shape) == flipped
    # A corrupt file is measured again and rewritten whole.
    C.cache_path().write_text("{not json")
    assert C.choose_path("auto", *shape) in ("native", "gemm")
    assert json.loads(C.cache_path().read_text())


def test_explicit_choices_and_infeasible_shapes_do_not_time(pynative, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert C.choose_path("native", 4, 6, 3, 1, 1, 4) == "native"
    assert C.choose_path("gemm", 4, 6, 3, 1, 1, 4) == "gemm"
    # The 7x7 stem at 64 px would need an 800 MB im2col matrix: native under every choice.
    assert C.choose_path("gemm", 3, 64, 7, 2, 3, 64) == "native"
    assert C.choose_path("auto", 3, 64, 7, 2, 3, 64) == "native"
    assert not C.cache_path().exists()
    with pytest.raises(ValueError, match="model.conv must be one of"):
        C.choose_path("fast", 4, 6, 3, 1, 1, 4)


@pytest.mark.slow
def test_the_default_run_says_which_path_each_convolution_took_and_why(tiny_run):
    from runner.models.onednn import isa_pays

    m = metrics(tiny_run)
    flops, conv = m["flops"], m["conv"]
    # The default, model.conv=best: onednn on a CPU where it pays (AVX2 or better, a compiler here), else
    # native; with onednn, each layer the algorithm measured fastest for its shape (oneDNN's unless
    # im2col + MatMul or the dense matmul beat it on a small output; in the blocked body the 4x4 stage's
    # 3x3 convolutions with Winograd weight gradients), recorded layer by layer.
    path = "onednn" if isa_pays(None) and has_compiler() else "native"
    assert conv["asked"] == "best" and conv["path"] == path and conv["reason"]
    paths = flops["conv_paths"]
    allowed = {"onednn", "gemm", "dense", "winograd-dw", "winograd"} if path == "onednn" else {"native"}
    assert set(paths) <= allowed and sum(e["layers"] for e in paths.values()) == 9
    names = sorted(n for e in paths.values() for n in e["names"])
    assert (
        len(set(names)) == 9
        and "stem.0" in names
        and all(n.endswith("conv1") or n.endswith("conv2") or n.startswith(("stem", "layer")) for n in names)
    )
    # The stem (8x8 output) is never timed against anything: oneDNN's direct kernel.
    assert "stem.0" in paths.get(path, {}).get("names", [])
    assert sum(e["forward_flops_per_sample"] for e in paths.values()) == flops["forward_conv_per_sample"]
    assert m["cpu_isa"]["value"] == (None if path == "onednn" else "AVX2")


AVX2 = frozenset("sse4_1 avx fma avx2".split())  # onednn measured faster than native from AVX2 up


def test_best_falls_back_to_native_saying_why_and_what_it_costs(tmp_path, monkeypatch):
    from runner.models import onednn

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))  # nothing built yet: it must compile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "empty"))
    # A CPU without AVX2 (onednn was not measured there): native.
    old = onednn.choose(None, frozenset("sse4_1 avx".split()))
    assert old.path == "native" and "lacks AVX2 and FMA" in old.reason
    # An ISA cap below AVX2 (ONEDNN_MAX_CPU_ISA, or device.cpu_isa_cap): native, with the cost.
    capped = onednn.choose("sse41", AVX2)
    assert capped.path == "native" and "ONEDNN_MAX_CPU_ISA=sse41" in capped.reason and "2.2x" in capped.cost
    assert all(map(onednn.cap_allows_fast_isa, (None, "", "default", "AVX2", "AVX512_CORE_AMX", "avx10_1_512")))
    # No compiler: CXX names none, or PATH has none.
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    nocc = onednn.choose(None, AVX2)
    assert nocc.path == "native" and "no C++ compiler" in nocc.reason and nocc.cost
    assert "model.conv=best runs native convolutions: " in nocc.line() and "\n" not in nocc.line()
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "no g++ or c++ on PATH" in onednn.choose(None, AVX2).reason


@needs_compiler
def test_best_takes_onednn_where_it_pays_and_then_needs_no_compiler(tmp_path, monkeypatch):
    from runner.models import onednn

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    chosen = onednn.choose(None, AVX2)  # builds the library, once per machine
    assert chosen.path == "onednn" and chosen.cost == ""
    assert onednn.choose("AVX2", AVX2 | {"avx512f"}).path == "onednn"  # the runner's old cap still pays
    # Built: a later process needs no compiler to take the fast path.
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert onednn.choose(None, AVX2).path == "onednn"


def test_the_runner_decides_best_before_mindspore_loads(monkeypatch):
    """`best` is decided in a process that has not imported MindSpore (so the ISA cap can still be set), by
    models/onednn.py choose() under the cap the run will have: the user's ONEDNN_MAX_CPU_ISA, else
    device.cpu_isa_cap. Asserted on the real decision, with nothing stubbed."""
    import subprocess
    import sys

    from conftest import REPO

    from runner.models import onednn
    from runner.training.environment import ISA_VAR, choose_conv

    code = (
        "import sys, json\n"
        "from hydra import compose, initialize_config_dir\n"
        "from runner.config.schema import register\n"
        "from runner.training.environment import choose_conv\n"
        "register()\n"
        "with initialize_config_dir(config_dir=sys.argv[1], version_base='1.3'):\n"
        "    cfg = compose('config', overrides=['device=cpu'])\n"
        "print(json.dumps([choose_conv(cfg)['path'], 'mindspore' in sys.modules]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ISA_VAR}
    proc = subprocess.run([sys.executable, "-c", code, str(REPO / "conf")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    path, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert path == onednn.choose(None).path and loaded is False
    # The cap the run will have is the one decided under: the user's variable wins over device.cpu_isa_cap.
    monkeypatch.delenv(ISA_VAR, raising=False)
    capped = choose_conv(compose_cfg("device=cpu", "device.cpu_isa_cap=AVX2"))
    assert (capped["path"], capped["reason"]) == (onednn.choose("AVX2").path, onednn.choose("AVX2").reason)
    monkeypatch.setenv(ISA_VAR, "SSE41")
    user = choose_conv(compose_cfg("device=cpu", "device.cpu_isa_cap=AVX2"))
    assert (user["path"], user["reason"]) == (onednn.choose("SSE41").path, onednn.choose("SSE41").reason)
    assert user["path"] == "native" and "SSE41" in user["reason"]  # oneDNN's kernels do not pay below AVX2
    # Pinned choices are taken as they are, without deciding anything.
    monkeypatch.delenv(ISA_VAR)
    pinned = choose_conv(compose_cfg("device=cpu", "model.conv=native"))
    assert pinned["asked"] == pinned["path"] == "native" and pinned["reason"] == "as configured"


def test_onednn_pool_takes_the_threads_its_rank_is_given(tmp_path):
    """Each data-parallel rank on one host gets its share of the CPUs, and onednn's pool keeps to it."""
    import subprocess
    import sys

    from runner.training.distributed import rank_threads

    cpus = len(os.sched_getaffinity(0))
    assert rank_threads(compose_cfg("distributed=dp", "distributed.workers=2").distributed) == max(1, cpus // 2)
    assert rank_threads(compose_cfg().distributed) is None  # one process: every CPU, MindSpore's default
    if not has_compiler():
        return
    from runner.models import onednn

    probe = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).PoolThreads())"
    lib = onednn.library()
    for given, want in ((None, cpus), ("1", 1), (str(cpus + 5), cpus)):
        env = {k: v for k, v in os.environ.items() if k != onednn.THREADS_VAR}
        if given:
            env[onednn.THREADS_VAR] = given
        out = subprocess.run([sys.executable, "-c", probe, lib], env=env, capture_output=True, text=True, check=True)
        assert int(out.stdout) == want, given


def test_a_misspelt_choice_is_refused_while_composing(tmp_path, tiny):
    bad = run_in_process(tmp_path / "b", *tiny, "model.conv=fast", check=False)
    assert bad.returncode != 0 and "fast" in bad.stderr + bad.stdout


def _run_with(path, tiny_run, tmp_path_factory):
    """A TINY run whose convolutions took `path`: the shared default run when that is its path."""
    if set(metrics(tiny_run)["flops"]["conv_paths"]) == {path}:
        return tiny_run
    run_dir = tmp_path_factory.mktemp(f"{path}_run")
    run_cli(run_dir, *TINY, f"model.conv={path}")
    return run_dir


@pytest.mark.parametrize("path", ["native", pytest.param("onednn", marks=needs_compiler)])
@pytest.mark.slow
def test_native_and_onednn_train_to_the_same_pinned_numbers(path, tiny_run, tmp_path_factory):
    from test_train import PINNED_LOSS, PINNED_VAL

    m = metrics(_run_with(path, tiny_run, tmp_path_factory))
    # The pinned default run's numbers under either path, within its tolerance (summation order differs).
    for step, loss in PINNED_LOSS.items():
        assert m["loss_curve"][step - 1] == pytest.approx(loss, abs=2e-4), step
    for key, value in PINNED_VAL.items():
        assert m[key] == pytest.approx(value, abs=2e-4), key
    assert set(m["flops"]["conv_paths"]) == {path} and m["flops"]["conv_paths"][path]["layers"] == 9
    # cpu_isa_cap=auto: no AVX2 cap for onednn's kernels, the cap for MindSpore's Conv2D.
    assert m["cpu_isa"]["value"] == (None if path == "onednn" else "AVX2")


@needs_compiler
@pytest.mark.slow
def test_an_onednn_run_exports_natively_and_evaluates_without_a_compiler(tiny_run, tmp_path_factory, tmp_path):
    run_dir = _run_with("onednn", tiny_run, tmp_path_factory)
    m = metrics(run_dir)
    # The exported file holds MindSpore's Conv2D: portable, the same numbers as the checkpoint, and
    # exporting needs no compiler.
    no_cc = {"CXX": str(tmp_path / "no-g++"), "XDG_CACHE_HOME": str(tmp_path / "empty"), "TMPDIR": str(tmp_path)}
    proc = run_module("runner.export", f"run={run_dir}", "format=mindir", "parity_samples=10", env=no_cc)
    record = json.loads((outputs_of(proc) / "export.json").read_text())
    assert record["parity_ok"] and record["max_abs_diff"] <= 1e-4
    # Evaluating it where no compiler (and no built library) is falls back to Conv2D, says why in one
    # line, and measures the same accuracy.
    proc = run_module("runner.evaluate", f"run={run_dir}", env=no_cc)
    said = [line for line in (proc.stderr + proc.stdout).splitlines() if "runs native convolutions" in line]
    assert len(said) == 1 and "no C++ compiler" in said[0], proc.stderr
    evaluated = json.loads((outputs_of(proc) / "metrics.json").read_text())
    assert evaluated["top1"] == pytest.approx(m["val_accuracy"], abs=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["native", "gemm", "auto", pytest.param("onednn", marks=needs_compiler)])
def test_each_choice_trains_and_says_which_path_ran(tmp_path, tiny, choice):
    run_cli(tmp_path / choice, *tiny, f"model.conv={choice}", env={"XDG_CACHE_HOME": str(tmp_path)})
    m = metrics(tmp_path / choice)
    assert m["val_accuracy"] > 0.9  # native reaches 0.96 on this tiny run
    paths = m["flops"]["conv_paths"]
    # resnet8 at 8 px: stem, three blocks' two convs, two projections; all small enough for gemm
    assert sum(e["layers"] for e in paths.values()) == 9
    assert sum(e["forward_flops_per_sample"] for e in paths.values()) == m["flops"]["forward_conv_per_sample"]
    if choice != "auto":
        assert set(paths) == {choice}


def test_the_cpu_isa_cap_follows_the_convolution_path(monkeypatch):

    from runner.training.environment import ISA_VAR, cap_cpu_isa

    def cap(*overrides):
        monkeypatch.delenv(ISA_VAR, raising=False)
        cfg = compose_cfg("device=cpu", *overrides)
        return cap_cpu_isa(cfg.device, cfg.model.conv), os.environ.get(ISA_VAR)

    # MindSpore's Conv2D needs AVX2 on AVX-512 CPUs; onednn's blocked kernels are the AVX-512 ones.
    assert cap() == ({"value": "AVX2", "set_by": "runner"}, "AVX2")
    assert cap("model.conv=gemm") == ({"value": "AVX2", "set_by": "runner"}, "AVX2")
    assert cap("model.conv=onednn") == ({"value": None, "set_by": None}, None)
    # An explicit cap is the user's word, whatever the path.
    assert cap("model.conv=onednn", "device.cpu_isa_cap=AVX2") == ({"value": "AVX2", "set_by": "runner"}, "AVX2")
    assert cap("device.cpu_isa_cap=") == ({"value": None, "set_by": None}, None)


def test_a_conv_choice_a_mindcv_model_would_ignore_is_refused():

    from runner.models.build import build_model

    cfg = compose_cfg("model=mindcv", "model.conv=gemm")
    with pytest.raises(ModelError, match="model.conv=gemm applies to the runner's own ResNets"):
        build_model(cfg.model, 10, 3, 32)


ZOO_CONVS = [
    dict(in_channels=4, out_channels=8, kernel_size=3, pad_mode="pad", padding=1, group=2, has_bias=True),
    dict(in_channels=6, out_channels=6, kernel_size=3, stride=2, pad_mode="same", group=6),  # depthwise
    dict(
        in_channels=4,
        out_channels=6,
        kernel_size=(3, 5),
        stride=(2, 1),
        pad_mode="pad",
        padding=(1, 0, 2, 1),
        dilation=(1, 2),
    ),
    dict(in_channels=4, out_channels=6, kernel_size=1, pad_mode="valid", has_bias=True),
]


@needs_compiler
@pytest.mark.parametrize("kw", ZOO_CONVS, ids=["grouped-bias", "depthwise-same", "rect-dilated", "1x1-bias"])
def test_a_zoo_models_convolutions_run_onednn_with_the_same_parameters_and_gradients(graph, kw):
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.features = nn.SequentialCell([nn.Conv2d(**kw)])

        def construct(self, x):
            return self.features(x)

    rng = np.random.default_rng(5)
    ref, alt = Net(), Net()
    for a, b in zip(alt.get_parameters(), ref.get_parameters()):
        a.set_data(b.data)
    names = [p.name for p in alt.get_parameters()]
    assert C.use_onednn(alt) == 1 and type(alt.features[0]) is C.OneDNNConv2d
    assert [p.name for p in alt.get_parameters()] == names  # checkpoints load as before
    x = Tensor(rng.standard_normal((2, kw["in_channels"], 9, 10), dtype=np.float32))
    want_y = ref(x).asnumpy()
    dy = Tensor(rng.standard_normal(want_y.shape, dtype=np.float32))

    def all_grads(net):
        grads = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)(net, net.trainable_params())
        (dx,), dws = grads(x, dy)
        return [net(x).asnumpy(), dx.asnumpy(), *(d.asnumpy() for d in dws)]

    for want, got in zip(all_grads(ref), all_grads(alt), strict=True):
        assert want.shape == got.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_onednn_without_a_compiler_fails_before_anything_runs(tmp_path, tiny):
    proc = run_in_process(
        tmp_path, *tiny, "model.conv=onednn", "dry_run=true", check=False, env={"CXX": "/no/such/g++"}
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no C++ compiler (CXX=/no/such/g++)" in " ".join(proc.stderr.split())


@pytest.fixture
def read_only_cache(tmp_path):
    """$XDG_CACHE_HOME on a read-only bind mount that already holds mindspore-runner/ (EROFS, which is
    no PermissionError; root ignores chmod, so a mount is the only honest read-only folder here)."""
    import subprocess

    src, mnt = tmp_path / "src", tmp_path / "cache"
    (src / "mindspore-runner").mkdir(parents=True, mode=0o700)
    mnt.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(mnt)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)])


@pytest.mark.slow
def test_a_read_only_cache_falls_back_to_a_temporary_directory(read_only_cache, monkeypatch, caplog):
    import errno
    import logging
    import tempfile

    from runner.models import onednn

    if not has_compiler():
        from conftest import COMPILER_REASON

        pytest.skip(COMPILER_REASON)
    with pytest.raises(OSError) as e:
        (read_only_cache / "mindspore-runner" / "probe").write_text("x")
    assert e.value.errno == errno.EROFS
    monkeypatch.setenv("XDG_CACHE_HOME", str(read_only_cache))
    with caplog.at_level(logging.WARNING, logger="runner.models.onednn"):
        built = [onednn.library() for _ in range(3)]  # each onednn layer of a network asks for it
    assert built[0].startswith(tempfile.gettempdir()) and not built[0].startswith(str(read_only_cache))
    assert built == [built[0]] * 3
    said = [r.getMessage() for r in caplog.records if str(read_only_cache) in r.getMessage()]
    assert len(said) == 1 and "cannot write" in said[0], said  # one fact, said once per process
