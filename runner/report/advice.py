"""Short notes grounded in what a run or a sweep measured; no note without a number behind it."""

from typing import Optional

HOST_FRACTION = 0.3  # host-side share of step time above which the data path is worth a look
# model.conv=onednn against native on ResNet-18, BENCHMARKS.md (bench/vs_torch.py)
ONEDNN_SPEEDUP = "1.6x (AVX2) to 2.2x (AVX-512)"


def run_notes(m, pynative_step_ms: Optional[float] = None, in_sweep: bool = False) -> list:
    """Notes from one run's metrics (a RunMetrics). pynative_step_ms: this machine's measured steady step of
    the same configuration in pynative mode (runner/report/speed.py), None where none was measured; in_sweep:
    the run is a sweep's job, whose summary compares the jobs' modes itself (sweep_notes)."""
    notes = []
    padding = m.padding.get("kind")
    if m.compile_count > 1:
        why = f"input shapes varied with padding={padding}" if padding != "fixed" else "despite padding=fixed"
        notes.append(
            f"The graph compiled {m.compile_count} times ({why}); each distinct input shape costs a compile. "
            "padding=fixed gives every batch one shape."
        )
    host = m.host_fraction
    if host is not None and host > HOST_FRACTION and not m.sink["effective"]:
        where = (
            "MindSpore does not sink on CPU, so more data.num_parallel_workers or a lighter pipeline is the lever"
            if m.device_target == "CPU"
            else "sink=on moves that loop onto the device"
        )
        notes.append(
            f"{host:.0%} of the steady training time was host-side work between steps (data fetch, Python) "
            f"with sink off; {where}."
        )
    if m.sink["requested"] and not m.sink["effective"]:
        notes.append(
            "sink=on changed nothing here: MindSpore's Model.train does not sink on CPU (sink.effective=false)."
        )
    paths = m.flops.get("conv_paths") or {}
    conv_flops = sum(e["forward_flops_per_sample"] for e in paths.values())
    if m.device_target == "CPU" and "native" in paths and conv_flops:
        native = paths["native"]["forward_flops_per_sample"] / conv_flops
        share = f"{native:.0%} of the convolution FLOPs ran MindSpore's own Conv2D"
        conv = m.conv or {}
        if conv.get("asked") == "best" and conv.get("cost"):  # the default fell back, and it cost speed
            notes.append(f"{share}: {conv['reason']}; {conv['cost']}.")
        elif conv.get("asked") != "best" and conv.get("onednn_pays"):  # pinned to a slower path on this CPU
            notes.append(
                f"{share} (model.conv={conv.get('asked')}); on this CPU the default, model.conv=best, runs oneDNN's "
                f"blocked kernels instead ({ONEDNN_SPEEDUP} the training throughput of ResNet-18 on 2-core CPUs "
                "in the runner's benchmarks)."
            )
    note = _compile_note(m, pynative_step_ms, in_sweep)
    if note:
        notes.append(note)
    return notes


def _compile_note(m, pynative_step_ms: Optional[float], in_sweep: bool) -> Optional[str]:
    """Whether pynative would have paid for a graph run whose compile outlasted its training, only as far as
    measured: pynative runs each step op by op, slower than the compiled graph, so a compile longer than the
    training proves nothing by itself. With pynative's step time measured on this
    machine, the two totals; without, the measurement that decides (a sweep does it, and says so itself)."""
    after = m.train_seconds - (m.first_call_seconds or 0.0)
    if m.mode not in ("graph", "jit") or m.compile_seconds is None or m.compile_seconds <= after:
        return None
    graph_s = m.compile_seconds + (m.step_time_median_ms or 0.0) / 1000 * m.steps
    spent = f"Compiling took {m.compile_seconds:.1f} s, more than the {after:.1f} s of training after it"
    if pynative_step_ms is None:
        if in_sweep:
            return None
        return (
            f"{spent}. Whether mode=pynative (no compile, slower steps) pays for a run this short is not measured on "
            "this machine: a sweep of this run's settings with -m mode=graph,pynative measures both, and its summary "
            "says whether the compile paid."
        )
    pynative_s = pynative_step_ms / 1000 * m.steps
    if pynative_s >= graph_s:
        return None  # the compile paid for itself: nothing to advise
    return (
        f"{spent}; this configuration in pynative mode stepped in {pynative_step_ms:.1f} ms on this machine, so "
        f"its {m.steps} steps would take ~{pynative_s:.1f} s against {graph_s:.1f} s (compile and steps) here: "
        "mode=pynative is faster for a run this short."
    )


def sweep_notes(rows: list) -> list:
    """Notes comparing finished jobs whose configurations differ in one group only (runner/report/sweep.py's JobRow)."""
    notes = []
    ok = [r for r in rows if r.metrics is not None]
    for a in ok:
        for b in ok:
            groups = {k.split(".")[0] for k in _diff(a.config, b.config)}
            ma, mb = a.metrics, b.metrics
            if groups == {"amp"} and ma.amp_level_used == "O0" and mb.amp_level_used != "O0":
                slow, fast = mb.throughput_samples_per_s, ma.throughput_samples_per_s
                if slow is not None and fast is not None and slow < fast:
                    why = ""
                    if mb.device_target == "CPU":
                        # docs/amp.md#on-a-cpu: float16 O2/O3 there is FP16 numerics on the FP32 path, no faster.
                        why = (
                            " On a CPU no 16-bit type computes faster than FP32 yet: AMP there buys FP16's "
                            "numerics (overflow, loss scale), not speed (docs/amp.md#on-a-cpu)."
                        )
                    notes.append(
                        f"AMP {mb.amp_level_used} (#{b.job}) ran at {slow:.0f} samples/s, slower than O0 "
                        f"(#{a.job}, {fast:.0f}) on {mb.device_target}.{why}"
                    )
            timed = None not in (ma.step_time_median_ms, mb.step_time_median_ms, mb.compile_seconds)
            if groups == {"mode"} and ma.mode == "pynative" and mb.mode in ("graph", "jit") and timed:
                saved = (ma.step_time_median_ms - mb.step_time_median_ms) / 1000 * mb.steps
                if mb.compile_seconds > saved:
                    notes.append(
                        f"{mb.mode} (#{b.job}) spent {mb.compile_seconds:.1f} s compiling to save "
                        f"{max(saved, 0):.1f} s of steps against pynative (#{a.job}): the compile did not pay for "
                        f"itself over {mb.steps} steps."
                    )
            if groups == {"mode"} and ma.mode == mb.mode and (ma.jit_level, mb.jit_level) in JIT_PAIRS:
                notes.append(_jit_level_note(a, b))
    return notes


# (from, to) mode.jit_level pairs the sweep notes compare, each once: the default against a chosen level.
JIT_PAIRS = {("auto", "O0"), ("auto", "O1"), ("O0", "O1"), ("auto", "O2"), ("O0", "O2"), ("O1", "O2")}


def _jit_level_note(a, b) -> str:
    """Which of two jobs that differ only in mode.jit_level paid: compile time plus the steps' time."""
    ma, mb = a.metrics, b.metrics

    def total(m):
        return m.compile_seconds + m.step_time_median_ms / 1000 * m.steps

    faster = b if total(mb) < total(ma) else a
    return (
        f"mode.jit_level={mb.jit_level} (#{b.job}) compiled in {mb.compile_seconds:.1f} s and stepped in "
        f"{mb.step_time_median_ms:.1f} ms, against {ma.jit_level} (#{a.job}) {ma.compile_seconds:.1f} s and "
        f"{ma.step_time_median_ms:.1f} ms on {mb.device_target}: over {mb.steps} steps "
        f"jit_level={faster.metrics.jit_level} was faster."
    )


def _diff(a: dict, b: dict) -> set:
    keys = set(a) | set(b)
    return {k for k in keys if a.get(k) != b.get(k)}
