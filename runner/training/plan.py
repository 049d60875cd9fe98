"""`plan=true`: what a run will need and take, printed before anything trains.

It builds what the run builds (the data, the network, the optimizer) in this process, without a run
directory, compiles nothing and trains nothing, then estimates:
- memory: weights, gradients and optimizer state counted from the built cells; activations from the
  output of every layer on one sample (forward hooks), times the batch; the host's peak as this process's
  resident memory with all that built, plus gradients, activations and graph compilation;
- FLOPs per step (2 per multiply-add, backward twice the forward) and the expected compile count (the
  padding option's batch shapes);
- time: steps per epoch times a step time, from this machine's own record of a run of the same
  configuration when there is one (speed.json in the cache directory, written by every finished run),
  else from the machine's measured matmul peak (runner/report/flops.py) at the utilization the runner's
  ResNets reach, plus a fixed cost per step.
When the estimated peak does not fit the memory this process may use, it says so and names the largest
batch size that fits. Tested against measured runs (tests/test_plan.py states the tolerances).
"""

import logging
from dataclasses import asdict, dataclass
from typing import Optional

from runner.report.speed import comparable, speed_key, speed_records

log = logging.getLogger("runner")

# Calibrated on the runner's own runs (2-core AMD EPYC, AVX2; MindSpore 2.10, graph mode, fp32; numbers in
# tests/test_plan.py's docstring). Time: the share of the matmul peak the ResNets' training steps reach
# (ResNet-18 at 64 px: 45 img/s = 40 GFLOP/s of a 67-72 GFLOP/s sgemm), and a host cost per step call and
# layer (data, callbacks, kernel launches): learned from this machine's recorded runs (host_ms_per_layer),
# STEP_OVERHEAD_MS_PER_LAYER (that machine's, under a load of ~20) until one is recorded. Memory beyond what the
# built network holds: the graph's own (RUNTIME_MB, and RUNTIME_PER_WEIGHT times the weights: the compiled
# graph's copies of parameters in the kernels' layouts), and the share of all layers' outputs the backward pass
# keeps alive at once (ReLU and BatchNorm outputs are freed or computed in place). Fitted to resnet8 at 8 px,
# resnet18 and resnet50 at 64 px: measured peaks 581, 977 and 1693 MB.
UTILIZATION = {"onednn": 0.55, "native": 0.30, "gemm": 0.30}
STEP_OVERHEAD_MS_PER_LAYER = 1.0
ACTIVATION_FACTOR = 0.6
RUNTIME_MB = 86.0
RUNTIME_PER_WEIGHT = 5.6


@dataclass
class RunPlan:
    """What plan=true prints (and returns from runner.train)."""

    model: str
    batch_size: int
    image: str  # CxHxW as the network sees it
    parameters: int
    trainable_parameters: int
    optimizer_state_values: int
    activation_values_per_sample: int
    weights_mb: float
    gradients_mb: float
    optimizer_mb: float
    activations_mb: float
    built_rss_mb: float  # this process's resident memory with the data, network and optimizer built
    peak_host_mb: float  # estimated peak resident memory of the run
    memory_limit_mb: Optional[float]  # what this process may use (MemAvailable, a cgroup limit), None unknown
    fits: Optional[bool]
    largest_batch: Optional[int]  # the largest batch size whose estimate fits, when this one does not
    flops_per_step: float
    compiles: int  # training-graph compiles the padding option means (0 in PyNative)
    steps_per_epoch: int
    total_steps: int
    step_ms: Optional[float]
    epoch_seconds: Optional[float]
    run_seconds: Optional[float]  # steps only: compilation and validation come on top
    speed_source: str

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        """The plan as a user reads it."""
        lines = [
            f"Plan for {self.model}, batch {self.batch_size}, input {self.image} (nothing was trained):",
            f"  parameters      {self.parameters:,} ({self.trainable_parameters:,} trainable)",
            f"  memory          weights {self.weights_mb:.1f} MB, gradients {self.gradients_mb:.1f} MB, "
            f"optimizer state {self.optimizer_mb:.1f} MB, activations {self.activations_mb:.1f} MB "
            f"({self.activation_values_per_sample:,} values a sample)",
            f"  peak host RSS   ~{self.peak_host_mb:.0f} MB estimated "
            f"({self.built_rss_mb:.0f} MB with everything built)"
            + (f" of {self.memory_limit_mb:.0f} MB available" if self.memory_limit_mb else ""),
            f"  FLOPs           {self.flops_per_step / 1e9:.2f} GFLOP per step",
            f"  compiles        {self.compiles} training graph(s) expected",
            f"  steps           {self.steps_per_epoch} per epoch, {self.total_steps} in all",
        ]
        if self.step_ms is not None:
            lines.append(
                f"  time            ~{self.step_ms:.1f} ms a step, ~{_duration(self.epoch_seconds)} an epoch, "
                f"~{_duration(self.run_seconds)} for the run's steps ({self.speed_source})"
            )
        else:
            lines.append(f"  time            not estimated ({self.speed_source})")
        if self.fits is False:
            fix = f" batch_size={self.largest_batch} fits" if self.largest_batch else " even batch_size=1 does not fit"
            lines.append(
                f"  DOES NOT FIT:   the estimated peak ({self.peak_host_mb:.0f} MB) is more than the "
                f"{self.memory_limit_mb:.0f} MB this process may use;{fix}."
            )
        return "\n".join(lines)


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def make_plan(cfg) -> RunPlan:
    """Build the run's data, network and optimizer (no run directory, no compile) and estimate the run."""
    from runner.report.flops import TRAIN_FLOPS_PER_FORWARD, forward_flops_per_sample, machine_peak
    from runner.report.outputs import current_rss_mb

    conv, target, data, net, steps, optimizer = _build(cfg)
    parameters, trainable, state = _value_counts(net, optimizer, ema=bool(cfg.ema.decay))
    fwd = forward_flops_per_sample(net, data.channels, data.height, data.width)
    # 16-bit activations under O2/O3, except on a CPU: there float16 runs the FP32 body rounded at its edges
    # (docs/amp.md#on-a-cpu) and bfloat16 is refused, so activations are FP32 as under O0.
    act_bytes = 2 if str(cfg.amp.level).upper() in ("O2", "O3") and target != "CPU" else 4
    per_sample_mb = fwd["activations"] * act_bytes * ACTIVATION_FACTOR / 2**20
    built = current_rss_mb()
    grads_mb = trainable * 4 / 2**20
    weights_mb = parameters * 4 / 2**20

    def peak(batch: int) -> float:
        return built + grads_mb + per_sample_mb * batch + RUNTIME_MB + RUNTIME_PER_WEIGHT * weights_mb

    limit = memory_limit_mb() if target == "CPU" else None
    fits = None if limit is None else peak(cfg.batch_size) <= limit
    largest = None
    if fits is False and limit is not None:
        largest = max(0, int((limit - peak(0)) / per_sample_mb)) if per_sample_mb else None
    flops_step = TRAIN_FLOPS_PER_FORWARD * fwd["total"] * cfg.batch_size
    step_ms, source = _step_ms(cfg, conv["path"], target, flops_step, fwd["layers"], machine_peak)
    compiles = int(data.padding.get("expected_batch_shapes", 1)) if str(cfg.mode.name) != "pynative" else 0
    return RunPlan(
        model=str(cfg.model.name),
        batch_size=int(cfg.batch_size),
        image=f"{data.channels}x{data.height}x{data.width}",
        parameters=parameters,
        trainable_parameters=trainable,
        optimizer_state_values=state,
        activation_values_per_sample=int(fwd["activations"]),
        weights_mb=weights_mb,
        gradients_mb=grads_mb,
        optimizer_mb=state * 4 / 2**20,
        activations_mb=per_sample_mb * cfg.batch_size,
        built_rss_mb=built,
        peak_host_mb=peak(cfg.batch_size),
        memory_limit_mb=limit,
        fits=fits,
        largest_batch=largest,
        flops_per_step=flops_step,
        compiles=compiles,
        steps_per_epoch=data.steps_per_epoch,
        total_steps=steps.total_steps,
        step_ms=step_ms,
        epoch_seconds=step_ms * data.steps_per_epoch / 1000 if step_ms is not None else None,
        run_seconds=step_ms * steps.total_steps / 1000 if step_ms is not None else None,
        speed_source=source,
    )


def _build(cfg) -> tuple:
    """(conv choice, device target, data, network, step plan, optimizer), as a run would build them."""
    from runner.datasets import build_data
    from runner.models import build_model
    from runner.training.environment import cap_cpu_isa, choose_conv, setup
    from runner.training.optim import build_optimizer
    from runner.training.recipe import plan_steps

    conv = choose_conv(cfg)
    cap_cpu_isa(cfg.device, conv["path"])
    target = setup(cfg.device, cfg.mode, cfg.seed)
    data = build_data(
        cfg.data, cfg.padding, cfg.batch_size, cfg.seed, augment=cfg.augment, label_depth=cfg.model.num_classes
    )
    net = build_model(cfg.model, data.num_classes, data.channels, min(data.height, data.width), conv=conv["path"])
    steps = plan_steps(cfg.epochs, cfg.sink, data.steps_per_epoch, cfg.sink.enabled and target != "CPU")
    optimizer = build_optimizer(cfg.optim, net.trainable_params(), data.steps_per_epoch, steps.total_steps)
    return conv, target, data, net, steps, optimizer


def _value_counts(net, optimizer, ema: bool) -> tuple:
    """(parameters, trainable parameters, optimizer state values): what the run holds besides activations."""
    weights = {id(p) for p in net.get_parameters()}
    parameters = sum(int(p.size) for p in net.get_parameters())
    trainable = sum(int(p.size) for p in net.trainable_params())
    # Everything the optimizer holds that is not a weight: moments, the step, the learning rate.
    state = sum(int(p.size) for p in optimizer.get_parameters() if id(p) not in weights)
    if ema:
        state += trainable  # the averaged copy (runner/amp/train_step.py)
    return parameters, trainable, state


def _step_ms(cfg, conv_path: str, target: str, flops_step: float, layers: int, machine_peak) -> tuple:
    """(estimated ms a step, where the estimate comes from)."""
    records = speed_records()
    record = records.get(speed_key(cfg, conv_path))
    if isinstance(record, dict) and isinstance(record.get("step_ms"), (int, float)):
        return float(record["step_ms"]), f"this machine's run of this configuration, {record.get('when', '')}"
    if target != "CPU":
        return None, f"no run of this configuration on this {target} yet"
    peak = machine_peak()
    if not peak.get("gflops_per_s"):
        return None, "this machine's matmul peak could not be measured"
    util = UTILIZATION.get(conv_path, UTILIZATION["native"])
    per_layer, learned = host_ms_per_layer(records, peak["gflops_per_s"], comparable(cfg, conv_path), target)
    ms = flops_step / (peak["gflops_per_s"] * 1e9 * util) * 1000 + per_layer * layers
    return ms, f"{util:.0%} of the {peak['gflops_per_s']:.0f} GFLOP/s peak, {per_layer:.2f} ms a layer ({learned})"


def host_ms_per_layer(records: dict, peak_gflops: float, like: dict, target: str = "CPU") -> tuple:
    """(this machine's host cost per layer and step in ms, where it comes from): what its recorded runs of other
    configurations took beyond their FLOPs at the peak's utilization, per layer, from the run that measures it
    best (the one whose FLOPs explain least of its step); else STEP_OVERHEAD_MS_PER_LAYER, a reference machine's.
    The cost is the host's (kernel launches, data, callbacks): it moves with the CPU and its load, which the
    matmul peak does not show, and with how the steps run: only runs alike in `like` (runner/report/speed.py
    comparable: mode, precision, convolution path) are learned from; a PyNative or O2 step's host cost is
    many times a graph-mode O0 one's."""
    from runner.amp.precision import resolve_level
    from runner.report.flops import machine_key

    def how(r: dict) -> tuple:
        return (
            str(r.get("mode")),
            resolve_level(str(r.get("amp")).upper().replace("AUTO", "auto"), target),
            str(r.get("conv")),
        )

    wanted = how(like)
    here = machine_key(None) + " | "
    best = None
    for k, r in records.items():
        if not (k.startswith(here) and isinstance(r, dict) and r.get("layers") and r.get("flops_per_step")):
            continue
        if not isinstance(r.get("step_ms"), (int, float)) or how(r) != wanted:
            continue
        util = UTILIZATION.get(str(r.get("conv")), UTILIZATION["native"])
        compute = r["flops_per_step"] / (peak_gflops * 1e9 * util) * 1000
        share = compute / r["step_ms"]
        if r["step_ms"] > compute and (best is None or share < best[0]):
            best = (share, (r["step_ms"] - compute) / r["layers"], k.split(" | ", 3)[-1])
    if best is None:
        alike = f"{wanted[0]} {wanted[1]}, conv {wanted[2]}"
        return STEP_OVERHEAD_MS_PER_LAYER, f"a reference machine's: no run of this machine recorded as {alike} yet"
    return best[1], f"measured by this machine's run of {best[2]}"


def memory_limit_mb() -> Optional[float]:
    """Memory this process may still use: the smaller of MemAvailable and the cgroup's limit left (Linux)."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) / 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            raw = f.read().strip()
        if raw != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                used = int(f.read().strip())
            found.append((int(raw) - used) / 2**20)
    except (OSError, ValueError):
        pass
    from runner.report.outputs import current_rss_mb

    # This process's own memory is in use already and counts toward the run's peak.
    return min(found) + current_rss_mb() if found else None
