"""Checks that need more than a type: ranges and contradictions, before anything heavy loads."""

import importlib.util
import math
import os
from enum import Enum

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.config.amp_dtype import amp_problems
from runner.config.callables import target_allowed, target_refusal
from runner.config.isa import check_cpu_isa
from runner.config.optim_options import OPTIMIZERS, SCHEDULES
from runner.config.schema import (
    AugmentConfig,
    Config,
    DataConfig,
    LossScaleConfig,
    ModeConfig,
    ModelConfig,
    OptimConfig,
    PaddingConfig,
    validation_every,
)
from runner.config.tree import walk
from runner.datasets.errors import DataConfigError, error_reason
from runner.datasets.settings import check_padding as check_padding_values
from runner.errors import ConfigError


def check_target(path: str, target) -> None:
    """Refuse a `_target_` outside the explicit list of callables (runner/config/callables.py ALLOWED_TARGETS)."""
    if not target_allowed(target):
        raise target_refusal(path, target)


# Fields each choice reads. A field set away from its default under a choice that does not read it
# would silently do nothing, so it is refused: (choice key, fields considered, fields read per choice).
USES = {
    "mode": ("mode.name", ("jit_level",), {"graph": {"jit_level"}, "jit": {"jit_level"}, "pynative": set()}),
    "padding": (
        "padding",
        ("height", "width", "method", "fill", "buckets"),
        {"fixed": {"height", "width", "method", "fill"}, "bucket": {"buckets", "fill"}, "none": set()},
    ),
    "data": (
        "data",
        ("val_fraction", "num_classes", "num_samples", "image_size", "root", "on_bad_sample"),
        {
            "digits": {"val_fraction"},
            "synthetic": {"val_fraction", "num_classes", "num_samples", "image_size"},
            "imagefolder": {"root", "on_bad_sample"},
            "cifar10": {"root"},
            "cifar100": {"root"},
            "mnist": {"root"},
            "csv": {"root", "on_bad_sample"},
            "mindrecord": {"root"},
        },
    ),
    "amp.loss_scale": (
        "amp.loss_scale.type",
        ("init", "factor", "window", "drop_overflow_update"),
        {"none": set(), "fixed": {"init", "drop_overflow_update"}, "dynamic": {"init", "factor", "window"}},
    ),
    # Declared with each option (runner/config/optim_options.py): "onecycle" reads no warmup, its rise is one.
    "optim": ("optim.schedule", *SCHEDULES.uses()),
    "optim.name": ("optim.name", *OPTIMIZERS.uses()),
    "model": (
        "model.style",
        ("depth", "width", "stem", "stem_pool", "arch", "checkpoint"),
        {
            "cifar": {"depth", "width"},
            "imagenet": {"depth", "width", "stem", "stem_pool"},
            "mindcv": {"arch", "checkpoint", "stem_pool"},
        },
    ),
    "augment": (
        "augment",
        ("randaugment_num_ops", "randaugment_magnitude", "num_magnitude_bins", "autoaugment_policy"),
        {
            "none": set(),
            "basic": set(),
            "imagenet": set(),
            "randaugment": {"randaugment_num_ops", "randaugment_magnitude", "num_magnitude_bins"},
            "autoaugment": {"autoaugment_policy"},
            "trivialaugment": {"num_magnitude_bins"},
        },
    ),
}


def fields_read(section: str, kind: str) -> set:
    """The fields of `section` (a USES key) that its option `kind` reads: `fields_read("padding", "bucket")`."""
    return set(USES[section][2][kind])


def unused_fields(section: str, node, defaults, kind: str) -> list:
    """`section.field=value` for each field set away from its default that the choice `kind` ignores."""
    key, fields, uses = USES[section]
    prefix = key.rpartition(".")[0] or key  # "optim.name" chooses among fields of `optim`
    return [
        f"{prefix}.{f}={_plain(getattr(node, f))}"
        for f in fields
        if f not in uses[kind] and _plain(getattr(node, f)) != _plain(getattr(defaults, f))
    ]


def _unused_message(section: str, kind: str, ignored: list) -> str:
    key, _, uses = USES[section]
    reads = "; ".join(f"{k} reads {', '.join(sorted(v)) or 'none of them'}" for k, v in uses.items())
    return f"{key}={kind} does not use {', '.join(ignored)}; remove it ({reads})"


def check_padding(padding, defaults) -> None:
    """Raise ConfigError for impossible `padding` values and for fields the chosen option would ignore."""
    kind = padding.name
    ignored = unused_fields("padding", padding, defaults, kind)
    if ignored:
        raise ConfigError(_unused_message("padding", kind, ignored) + ".")
    try:
        check_padding_values(padding)
    except DataConfigError as e:
        raise ConfigError(str(e)) from None


def _plain(value):
    if hasattr(value, "name"):  # an Enum
        return value.name
    return list(value) if hasattr(value, "__len__") and not isinstance(value, str) else value


# Settings that must be above zero.
POSITIVE = (
    "batch_size",
    "epochs",
    "log_every",
    "model.width",
    "optim.lr",
    "data.num_parallel_workers",
    "amp.loss_scale.init",
    "amp.loss_scale.window",
)

# One setting's own range: (setting, its value is wrong when, what it must be). The message reads
# "<setting> must be <what>, got <value>".
RANGES = (
    ("sink.sink_size", lambda v: v == 0 or v < -1, "-1 (whole epoch) or positive"),
    ("amp.loss_scale.factor", lambda v: v <= 1, "above 1"),
    ("model.num_classes", lambda v: v is not None and v <= 0, "positive or null (take it from the data)"),
    ("data.val_fraction", lambda v: not 0 < v < 1, "between 0 and 1"),
    ("data.channels", lambda v: v not in (1, 3), "1 (grayscale) or 3 (RGB)"),
)

# The options whose fields are checked against what they read (USES): (USES key, node, defaults, choice).
CHOICES = (
    ("mode", "mode", ModeConfig, "mode.name"),
    ("data", "data", DataConfig, "data.name"),
    ("amp.loss_scale", "amp.loss_scale", LossScaleConfig, "amp.loss_scale.type"),
    ("optim", "optim", OptimConfig, "optim.schedule"),
    ("optim.name", "optim", OptimConfig, "optim.name"),
    ("model", "model", ModelConfig, "model.style"),
    ("augment", "augment", AugmentConfig, "augment.name"),
)


def _problems(cfg):
    """Every problem of cfg, one sentence each, in the order they are listed to the user."""
    yield from _value_problems(cfg)
    yield from _unused_field_problems(cfg)
    yield from _data_problems(cfg)
    yield from _schedule_and_jit_problems(cfg)
    yield from _optim_problems(cfg)
    yield from _model_problems(cfg.model)
    yield from _machine_problems(cfg)
    yield from _watch_problems(cfg)
    yield from _augment_problems(cfg)
    yield from _range_problems(cfg)
    yield from _idle_setting_problems(cfg)
    yield from amp_problems(cfg)


def _value_problems(cfg):
    """Each of POSITIVE above zero; each of RANGES within its range (data.* ones after the unused fields)."""
    for name in POSITIVE:
        value = OmegaConf.select(cfg, name)
        if value <= 0:
            yield f"{name} must be positive, got {value}"
    for name, wrong, what in RANGES[:2]:
        if wrong(OmegaConf.select(cfg, name)):
            yield f"{name} must be {what}, got {OmegaConf.select(cfg, name)}"


def _unused_field_problems(cfg):
    for section, node, defaults, choice in CHOICES:
        kind = OmegaConf.select(cfg, choice)
        kind = kind.value if isinstance(kind, Enum) else kind  # model.style is an Enum: its option is its value
        ignored = unused_fields(section, OmegaConf.select(cfg, node), defaults(), kind)
        if ignored:
            yield _unused_message(section, kind, ignored)


def _data_problems(cfg):
    for name, wrong, what in RANGES[2:]:
        if wrong(OmegaConf.select(cfg, name)):
            yield f"{name} must be {what}, got {OmegaConf.select(cfg, name)}"
    if len(cfg.data.mean) != cfg.data.channels or len(cfg.data.std) != cfg.data.channels:
        yield f"data.mean and data.std need {cfg.data.channels} values (data.channels)"
    if any(s <= 0 for s in cfg.data.std):
        yield f"data.std must be positive, got {list(cfg.data.std)}"


def _schedule_and_jit_problems(cfg):
    if cfg.optim.warmup_epochs < 0 or cfg.optim.warmup_epochs > cfg.epochs:
        yield f"optim.warmup_epochs must be between 0 and epochs ({cfg.epochs}), got {cfg.optim.warmup_epochs}"
    if cfg.optim.min_lr < 0 or cfg.optim.min_lr >= cfg.optim.lr:
        yield f"optim.min_lr must be at least 0 and below optim.lr ({cfg.optim.lr}), got {cfg.optim.min_lr}"
    if cfg.mode.jit_level == "O2" and cfg.mode.name == "jit":
        yield "mode.jit_level=O2 is for mode=graph: mindspore.jit (mode=jit) compiles at O0 or O1 only"
    elif cfg.mode.jit_level == "O2" and cfg.device.target in ("cpu", "gpu"):
        yield f"mode.jit_level=O2 (whole-graph sinking) runs on Ascend only; device={cfg.device.target} runs O0 or O1"


def _machine_problems(cfg):
    """The seed, the CPUs, the port and the data's folder: what this machine and run need."""
    if not 0 <= cfg.seed <= SEED_MAX:
        yield f"seed must be between 0 and 2**32 - 1 ({SEED_MAX}), got {cfg.seed}"
    cpus = os.cpu_count() or 1
    if cfg.data.num_parallel_workers > cpus:
        # Checked here: the dataset pipeline would fail on it only once built, with a traceback.
        n = cfg.data.num_parallel_workers
        yield f"data.num_parallel_workers must be at most the {cpus} CPUs of this machine, got {n}"
    d = cfg.distributed
    if d.master_port and not 1 <= d.master_port <= 65535:
        yield f"distributed.master_port must be 0 (pick a free one) or a port in 1..65535, got {d.master_port}"
    if cfg.data.name in ("imagefolder", "cifar10", "cifar100", "mnist", "csv", "mindrecord") and not cfg.data.root:
        yield f"data={cfg.data.name} needs data.root"


def _idle_setting_problems(cfg):
    """A setting that does nothing while its switch is off."""
    if not cfg.compile_cache.enabled and cfg.compile_cache.dir is not None:
        yield f"compile_cache.dir={cfg.compile_cache.dir} does nothing with compile_cache.enabled=false; remove one"
    pr = cfg.profile
    if pr.steps < 0 or pr.start_step < 1:
        yield f"profile.steps must be >= 0 (0: off) and profile.start_step >= 1, got {pr.steps} and {pr.start_step}"
    elif pr.steps == 0 and pr.start_step != 3:
        yield f"profile.start_step={pr.start_step} does nothing while profile.steps=0 (off); set profile.steps too"


def _watch_problems(cfg):
    """validation, checkpoint.monitor, early_stop and init_from against each other."""
    given, es, monitor = cfg.validation.every_epochs, cfg.early_stop, str(cfg.checkpoint.monitor)
    every = validation_every(cfg.validation, cfg.eval)
    if given is not None and given < 0:
        yield f"validation.every_epochs must be 0 (only at the end) or positive, got {given}"
    elif given is not None and given > 0 and not cfg.eval:
        yield f"validation.every_epochs={given} validates, but eval=false turns validation off; drop one"
    elif given is not None and given > cfg.epochs:
        yield f"validation.every_epochs={given} is beyond epochs={cfg.epochs}: it would validate only at the end (0)"
    for key, name in (("checkpoint.monitor", monitor), ("early_stop.monitor", str(es.monitor))):
        if name.startswith("val_") and every <= 0:
            why = "eval=false" if not cfg.eval else "validation.every_epochs=0 (only at the end)"
            yield (
                f"{key}={name} needs validation during training, and {why} gives none: set "
                "validation.every_epochs=N (with eval=true) or monitor train_loss"
            )
    ck = cfg.checkpoint
    if ck.top_k < 1:
        yield f"checkpoint.top_k must be at least 1, got {ck.top_k}"
    elif ck.top_k > 1 and (not ck.keep_best or ck.every_epochs == 0):
        why = "checkpoint.keep_best=false keeps none" if not ck.keep_best else "checkpoint.every_epochs=0 saves none"
        yield f"checkpoint.top_k={ck.top_k} keeps the best checkpoints by checkpoint.monitor, but {why}"
    if ck.keep_last < 1:
        yield f"checkpoint.keep_last must be at least 1 (a resume continues the latest), got {ck.keep_last}"
    if es.patience < 0 or es.min_delta < 0:
        yield f"early_stop.patience and early_stop.min_delta must not be negative, got {es.patience} and {es.min_delta}"
    elif es.patience == 0 and (str(es.monitor) != "auto" or es.min_delta != 0):
        yield "early_stop.monitor/min_delta are set but early stopping is off (early_stop.patience=0)"
    elif es.patience > 0 and (not cfg.checkpoint.keep_best or cfg.checkpoint.every_epochs == 0):
        yield (
            "early_stop makes the best checkpoint the final weights, so it needs one: "
            "checkpoint.keep_best=true and checkpoint.every_epochs >= 1"
        )
    elif es.patience > 0 and "auto" not in (str(es.monitor), monitor) and str(es.monitor) != monitor:
        yield (
            f"early_stop.monitor={es.monitor} differs from checkpoint.monitor={monitor}: the run would stop on one "
            "and keep the best by the other; set one of them"
        )


def _augment_problems(cfg):
    """Out-of-range augmentation and loss values, and augmentations the run's data or shapes forbid."""
    a = cfg.augment

    def within(name, value, lo, hi, hi_open=False):
        if not (lo <= value < hi if hi_open else lo <= value <= hi):
            yield f"{name} must be in [{lo}, {hi}{')' if hi_open else ']'}, got {value}"

    yield from within("augment.crop_padding", a.crop_padding, 0, float("inf"))
    yield from within("augment.affine_degrees", a.affine_degrees, 0, 180)
    yield from within("augment.affine_translate", a.affine_translate, 0, 1)
    yield from within("augment.affine_scale", a.affine_scale, 0, 1, hi_open=True)
    yield from within("augment.erasing_prob", a.erasing_prob, 0, 1)
    yield from within("augment.color_jitter", a.color_jitter, 0, 1)
    yield from within("augment.color_jitter_hue", a.color_jitter_hue, 0, 0.5)
    yield from _resized_crop_problems(cfg)
    yield from within("augment.randaugment_num_ops", a.randaugment_num_ops, 0, float("inf"))
    yield from within("augment.num_magnitude_bins", a.num_magnitude_bins, 2, float("inf"))
    yield from within("augment.randaugment_magnitude", a.randaugment_magnitude, 0, a.num_magnitude_bins, hi_open=True)
    yield from within("loss.label_smoothing", cfg.loss.label_smoothing, 0, 1, hi_open=True)
    for mix in ("mixup", "cutmix"):
        m = a[mix]
        yield from within(f"augment.{mix}.alpha", m.alpha, 0, float("inf"))
        yield from within(f"augment.{mix}.prob", m.prob, 0, 1)
        if m.alpha == 0 and m.prob != 1.0:
            yield f"augment.{mix}.prob={m.prob} does nothing while augment.{mix}.alpha is 0 (off); set the alpha too"
    if a.crop_padding > 0 and cfg.padding.name != "fixed":
        yield (
            f"augment.crop_padding={a.crop_padding} crops back to one input size, which needs padding=fixed "
            f"(padding={cfg.padding.name} keeps each image's own size); set augment.crop_padding=0"
        )
    if a.hflip and not cfg.data.mirrorable:
        yield (
            f"augment.hflip=true mirrors images, but data={cfg.data.name} is declared not mirrorable "
            "(data.mirrorable=false: a mirrored image would change class); remove augment.hflip, or set "
            "data.mirrorable=true if mirrored images keep their labels"
        )
    if a.color_jitter_hue and cfg.data.channels == 1:
        yield (
            f"augment.color_jitter_hue={a.color_jitter_hue} does nothing to gray images (data.channels=1); remove it"
        )


# MindSpore's vision ops refuse sizes, ratios and scales beyond float32's exact integers
# (mindspore/dataset/core/validator_helpers.py FLOAT_MAX_INTEGER) and counts beyond int32, with a
# ValueError of their own deep in the pipeline; checked here first.
FLOAT_MAX_INTEGER = 16_777_216
INT32_MAX = 2**31 - 1
# synthetic data is built in memory as int64 arrays (datasets/sources.py): a bound on its values.
SYNTHETIC_MAX_VALUES = 2**27


def _range_problems(cfg):
    """The numeric settings no other check bounds: each within what its consumer (MindSpore, msrun,
    numpy) accepts, so a typo is refused here in one sentence rather than deep inside MindSpore."""

    def within(name, value, lo, hi):
        if value is not None and not lo <= value <= hi:
            yield f"{name} must be in [{lo}, {hi}], got {value}"

    d, p, a = cfg.data, cfg.padding, cfg.augment
    if d.name == "synthetic":
        yield from within("data.num_classes", d.num_classes, 2, 100_000)
        yield from within("data.num_samples", d.num_samples, 2, INT32_MAX)
        yield from within("data.image_size", d.image_size, 1, FLOAT_MAX_INTEGER)
        values = d.num_samples * d.image_size**2 * d.channels
        if values > SYNTHETIC_MAX_VALUES:
            yield (
                f"data=synthetic of data.num_samples={d.num_samples} images of {d.image_size}x{d.image_size}x"
                f"{d.channels} is {values} values, beyond the {SYNTHETIC_MAX_VALUES} it builds in memory"
            )
    for i, (m, sd) in enumerate(zip(d.mean, d.std)):
        # Normalize runs on images scaled to [0, 1]; MindSpore accepts mean in [0, 255], std in (0, 255].
        yield from within(f"data.mean[{i}]", m, 0, 255)
        yield from within(f"data.std[{i}]", sd, 0, 255)
    if not 0 < d.input_scale <= FLOAT_MAX_INTEGER:  # positive, and within what Rescale accepts
        yield f"data.input_scale must be in (0, {FLOAT_MAX_INTEGER}] (MindSpore's Rescale's bound), got {d.input_scale}"
    if p.name == "fixed":
        yield from within("padding.height", p.height, 1, FLOAT_MAX_INTEGER)
        yield from within("padding.width", p.width, 1, FLOAT_MAX_INTEGER)
    if p.name == "bucket" and list(p.buckets):
        yield from within("padding.buckets[-1]", list(p.buckets)[-1], 1, FLOAT_MAX_INTEGER)
    if a.crop_padding > 0 and p.name == "fixed" and a.crop_padding > max(p.height, p.width):
        yield (
            f"augment.crop_padding={a.crop_padding} pads more than the {p.height}x{p.width} input on each side, so "
            "most crops would hold no image; use at most the input's side"
        )
    if a.resized_crop and len(a.crop_ratio) == 2:
        yield from within("augment.crop_ratio[1]", a.crop_ratio[1], 0, FLOAT_MAX_INTEGER)
    yield from within("augment.randaugment_num_ops", a.randaugment_num_ops, 0, INT32_MAX)
    yield from within("augment.num_magnitude_bins", a.num_magnitude_bins, 2, INT32_MAX)
    yield from within("batch_size", cfg.batch_size, 1, INT32_MAX)
    yield from within("device.id", cfg.device.id, 0, 4095)
    dist = cfg.distributed
    yield from within("distributed.workers", dist.workers, 1, 65535)
    yield from within("distributed.local_workers", dist.local_workers, 1, dist.workers)
    yield from within("distributed.node_rank", dist.node_rank, 0, 65535)
    yield from within("distributed.timeout_s", dist.timeout_s, 1, 86400)
    yield from within("checkpoint.every_epochs", cfg.checkpoint.every_epochs, 0, INT32_MAX)
    dg = cfg.diagnose
    yield from within("diagnose.every", dg.every, 1, INT32_MAX)
    yield from within("diagnose.patience", dg.patience, 1, INT32_MAX)
    yield from within("diagnose.max_islands", dg.max_islands, 0, 1000)
    if cfg.ladder is not None:
        yield from within("ladder.batch_size", cfg.ladder.batch_size, 1, INT32_MAX)
        yield from within("ladder.large_batch_size", cfg.ladder.large_batch_size, 1, INT32_MAX)


def _resized_crop_problems(cfg):
    a = cfg.augment
    scale, ratio = list(a.crop_scale), list(a.crop_ratio)
    if not a.resized_crop:
        defaults = AugmentConfig()
        unused = [
            f"augment.{k}={v}"
            for k, v, d in (("crop_scale", scale, defaults.crop_scale), ("crop_ratio", ratio, defaults.crop_ratio))
            if v != list(d)
        ]
        if unused:
            yield f"{', '.join(unused)} does nothing without augment.resized_crop=true; set it, or remove them"
        return
    if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
        yield f"augment.crop_scale is [min, max] area shares with 0 < min <= max <= 1, got {scale}"
    if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
        yield f"augment.crop_ratio is [min, max] aspect ratios (width/height) with 0 < min <= max, got {ratio}"
    if cfg.padding.name != "fixed":
        yield (
            "augment.resized_crop=true resizes every crop to one input size, which needs padding=fixed "
            f"(padding={cfg.padding.name} keeps each image's own size)"
        )
    if a.crop_padding > 0:
        yield (
            f"augment.resized_crop=true and augment.crop_padding={a.crop_padding} are two random crops of "
            "one image; keep one (set augment.crop_padding=0 for the ImageNet-style crop)"
        )


def _resolved(cfg) -> dict:
    """The config with every interpolation resolved, or ConfigError naming the one that cannot be."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(
            f"{key} cannot be resolved ({str(e).splitlines()[0].strip()}). Give it a literal value, or an "
            "interpolation that yields the setting's type (`python -m runner --cfg job` shows the config)."
        ) from None


def _non_finite(tree):
    for path, _, value in walk(tree):
        if isinstance(value, float) and not math.isfinite(value):
            yield f"{path}={value}"


SEED_MAX = 2**32 - 1  # numpy's RandomState and MindSpore's set_seed take 0 .. 2**32 - 1


def _model_problems(m):
    if m.style == "mindcv":
        if not m.arch:
            yield "model=mindcv needs model.arch, a mindcv.list_models() name (e.g. model.arch=mobilenet_v3_small_100)"
        if m.checkpoint and not os.path.isfile(m.checkpoint):
            yield f"model.checkpoint={m.checkpoint}: no such file"
    elif m.depth is None:
        yield f"model.style={m.style.value} needs model.depth"
    asked = []
    if not m.blocked_body:
        asked.append("model.blocked_body=false")
    if m.blocked_layers != "chosen":
        asked.append(f"model.blocked_layers={m.blocked_layers.value}")
    if asked and (m.style == "mindcv" or m.conv not in ("best", "onednn")):
        yield (
            f"{' and '.join(asked)} has no effect: blocked bodies are the runner's own ResNets' under "
            f"model.conv=best or onednn (this is model.style={m.style.value}, model.conv={m.conv.value})"
        )


def _optim_problems(cfg):
    o = cfg.optim
    kind = o.schedule
    if not 0 <= o.momentum < 1:
        yield f"optim.momentum must be in [0, 1), got {o.momentum}"
    if not 0 < o.beta2 < 1:
        yield f"optim.beta2 must be in (0, 1), got {o.beta2}"
    if o.eps <= 0:
        yield f"optim.eps must be positive, got {o.eps}"
    if o.weight_decay < 0:
        yield f"optim.weight_decay must be at least 0, got {o.weight_decay}"
    if not o.filter_bias_and_bn and o.weight_decay == 0:
        yield (
            "optim.filter_bias_and_bn=false has no effect with optim.weight_decay=0 (nothing is decayed); "
            "set a weight decay or drop it"
        )
    if o.nesterov and o.momentum == 0:
        yield "optim.nesterov=true needs optim.momentum above 0"
    if kind in ("step", "multistep", "exponential") and not 0 < o.gamma <= 1:
        yield f"optim.gamma must be in (0, 1], got {o.gamma}"
    if kind == "step" and o.step_epochs <= 0:
        yield f"optim.step_epochs must be positive, got {o.step_epochs}"
    if kind == "multistep":
        m = list(o.milestones)
        if not m or m[0] <= 0 or any(a >= b for a, b in zip(m, m[1:])) or m[-1] > cfg.epochs:
            yield f"optim.schedule=multistep needs optim.milestones: increasing epochs in (0, {cfg.epochs}], got {m}"
    if kind == "onecycle" and not 0 < o.pct_start < 1:
        yield f"optim.pct_start must be between 0 and 1, got {o.pct_start}"
    if kind == "onecycle" and o.div_factor < 1:
        yield f"optim.div_factor must be at least 1, got {o.div_factor}"
    if o.clip_grad_norm < 0:
        yield f"optim.clip_grad_norm must be positive (or 0: off), got {o.clip_grad_norm}"
    if o.accumulate_steps < 1:
        yield f"optim.accumulate_steps must be at least 1, got {o.accumulate_steps}"
    if not 0 <= cfg.ema.decay < 1:
        yield f"ema.decay must be in [0, 1) (0: off), got {cfg.ema.decay}"


def check_tools(cfg) -> None:
    """Raise ModelError when training this config needs a tool the machine lacks (onednn: a C++ compiler)."""
    if cfg.model.conv == "onednn" and cfg.device.target in ("cpu", "auto"):
        from runner.models.onednn import find_compiler  # numpy and ctypes: only for model.conv=onednn

        find_compiler()


# The package each optional logger imports, checked before anything is built or trained.
LOGGER_PACKAGES = {"tensorboard": "tensorboardX", "mlflow": "mlflow", "wandb": "wandb"}


def check_loggers(cfg) -> None:
    """Raise ConfigError when a chosen logger's package is not installed or does not import (all named at
    once). Imported here, before MindSpore loads and before the run directory is written: the logger
    imports it anyway, and a package that is present but broken fails only on import."""
    problems = []
    for name, pkg in LOGGER_PACKAGES.items():
        if cfg.logger.get(name) is None:
            continue
        if importlib.util.find_spec(pkg) is None:
            problems.append(f"logger={name} needs {pkg}, which is not installed")
            continue
        try:
            importlib.import_module(pkg)
        except Exception as e:  # a broken install raises whatever its own imports raise
            why = f"{type(e).__name__}: {error_reason(e)}"
            problems.append(f"logger={name} needs {pkg}, which is installed but does not import ({why})")
    if problems:
        raise ConfigError(
            f"{'; '.join(problems)}. Install it: pip install -e '.[loggers]' (or the package alone), or leave it "
            "out of `logger`: metrics.csv is written without any of them."
        )


def validate(cfg, *more) -> None:
    """Raise ConfigError naming every value that is out of range or contradicts another.

    more: checks of the layers above (cfg -> problems), e.g. runner/rundir/saved_run.py init_from_problems,
    whose problems join this one message; config/ itself reads no run directory."""
    tree = _resolved(cfg)
    bad = list(_non_finite(tree))
    if bad:
        raise ConfigError(f"Non-finite numbers are not settings: {', '.join(bad)}. Give finite values.")
    # Resolved: a node built by an interpolation (`${oc.decode:...}`) is a plain dict, walked too.
    for path, key, target in walk(tree):
        if key == "_target_":
            check_target(path, target)
    plain = OmegaConf.to_container(cfg)
    check_padding(cfg.padding, PaddingConfig())
    try:
        # `+key=value` adds keys even to typed nodes; a key the schema lacks would be silently ignored.
        OmegaConf.merge(OmegaConf.structured(Config), plain)
    except OmegaConfBaseException as e:
        from runner.config.suggest import config_keys, did_you_mean

        key = str(getattr(e, "full_key", "?"))
        raise ConfigError(
            f"{key} is not a setting of the runner{did_you_mean(key, config_keys(plain))}: "
            "`python -m runner --help` lists every setting with its default."
        ) from None
    check_cpu_isa(cfg.device)
    problems = list(_problems(cfg)) + [problem for check in more for problem in check(cfg)]
    if problems:
        raise ConfigError("Invalid configuration: " + "; ".join(problems) + ".")
