"""Quantized checkpoints: which scheme a ``quantization_config`` names, and the bytes vLLM keeps.

The per-scheme facts (value bits, scale dtype and granularity, zero points, minimum and native
compute capability, kernels) are data, ``servebook/data/quant_schemes.toml``, read from vLLM
0.27.1's ``model_executor/layers/quantization/`` and re-read in 0.32.0's and 0.34.0's (the same in
all three; the drift claims of ``vllm_claims.toml`` quote each). :func:`resolve` turns a checkpoint's
``quantization_config`` into a :class:`Quantization`; :meth:`Quantization.matrix_bytes` sizes one
quantized 2-D projection as resident on a CUDA GPU after the kernel's weight preparation
(Marlin drops a symmetric scheme's zero points and keeps act-order sort indices);
:func:`check_loads` refuses what the chosen release does not load (group activation ordering
from 0.32.0 on: :func:`servebook.vllm_rules.act_order_loads`); :func:`kernel_on` says which kernel a
catalogue GPU runs it with, or raises :class:`~servebook.errors.ServebookError` when the GPU cannot
run it at all.

Modelled ``quant_method`` values: ``awq``, ``gptq`` (symmetric, 4 or 8 bits, optional
``desc_act``), ``fp8`` (per tensor or ``weight_block_size`` blocks), ``compressed-tensors``
(W8A8 int8 and FP8, W4A16/W8A16 pack-quantized, NVFP4; ``config_groups`` targeting ``Linear``
and an ``ignore`` list), ``modelopt`` (FP8 and NVFP4, ``exclude_modules``) and ``mxfp4``
(gpt-oss experts). Units: bytes; compute capability as ``major.minor`` (9.0 = Hopper).

Not modelled (the sizes are a few MiB on an 8B model): Marlin's per-layer workspace (one int32
per SM), tile padding of shapes Marlin cannot tile, swizzle padding of NVFP4 block scales.
"""
from __future__ import annotations

import fnmatch
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from servebook.errors import ConfigError, ServebookError
from servebook.vllm_rules import RULE_RELEASES, act_order_loads, rule_release

#: The releases whose source the scheme rules were read in (0.27.1 and 0.34.0 follow them too).
_READ_IN = f"vLLM {RULE_RELEASES[0]} to {RULE_RELEASES[-1]}"

_DATA = Path(__file__).resolve().parent / "data" / "quant_schemes.toml"
#: 16-bit activations/scales where a scheme keeps the model's dtype.
_MODEL_DTYPE_BYTES = 2


@dataclass(frozen=True)
class Scheme:
    """One row of ``quant_schemes.toml`` (see the file's header for each field's meaning)."""

    name: str
    description: str
    value_bits: int
    scale: str
    scale_bytes: int
    zero_bits: int
    min_compute_capability: float
    native_compute_capability: float
    kernel: str
    fallback_kernel: str
    source: str
    group_size: int | None = None
    fp32_per_matrix: int = 0


@lru_cache(maxsize=1)
def _data() -> dict:
    return tomllib.loads(_DATA.read_text())


def schemes() -> dict[str, Scheme]:
    """Every scheme of the data file by name."""
    return {name: Scheme(name=name, **row) for name, row in _data()["scheme"].items()}


def compute_capability(gpu_name: str) -> float:
    """Compute capability of a catalogue GPU (its canonical name), e.g. 9.0 for the H200."""
    table = _data()["compute_capability"]
    if gpu_name not in table:
        raise ServebookError(f"no compute capability recorded for GPU {gpu_name!r}; add it to "
                             "servebook/data/quant_schemes.toml [compute_capability] "
                             "(developer.nvidia.com/cuda-gpus)")
    return float(table[gpu_name])


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization as vLLM stores it (the same from 0.26.0 to 0.34.0).

    Attributes:
        scheme: the data row (value bits, scales, kernels).
        method: the config's ``quant_method``.
        value_bits: bits per stored weight value (4 or 8).
        group_size: input features per scale for ``"group"`` scales (the whole row when -1).
        block: ``(rows, cols)`` per scale for ``"block"`` scales.
        zero_bits: bits per zero point and group (0: none kept).
        act_order: GPTQ ``desc_act`` / compressed-tensors ``actorder: group`` with more than one group
            (g_idx kept; refused from vLLM 0.32.0 on, :func:`check_loads`).
        dynamic_order: compressed-tensors ``actorder: dynamic`` with groups (no index kept; loads on
            0.26.0, refused from 0.32.0 on like ``act_order``).
        lm_head: the LM head is quantized too.
        ignore: module patterns left in 16-bit, as the config spells them.
        ignore_style: how vLLM matches them: ``"substring"`` (AWQ ``modules_to_not_convert``),
            ``"exact"`` (compressed-tensors ``ignore``, with ``re:`` regexes) or ``"glob"``
            (ModelOpt ``exclude_modules``).
        experts_only: only routed-expert matrices are quantized (gpt-oss MXFP4).
    """

    scheme: Scheme
    method: str
    value_bits: int
    group_size: int | None = None
    block: tuple[int, int] | None = None
    zero_bits: int = 0
    act_order: bool = False
    dynamic_order: bool = False
    lm_head: bool = False
    ignore: tuple[str, ...] = ()
    ignore_style: str = "substring"
    experts_only: bool = False
    fp32_per_matrix: int = field(default=0)
    #: GPTQ ``modules_in_block_to_quantize`` (flattened): only these modules are quantized; () = all.
    only: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """Short label, e.g. ``awq int4 g128`` or ``fp8_block 128x128``."""
        if self.block:
            return f"{self.scheme.name} {self.block[0]}x{self.block[1]}"
        if self.scheme.scale == "group" and self.group_size:
            return f"{self.scheme.name} int{self.value_bits} g{self.group_size}" if self.scheme.name in (
                "awq", "gptq", "wna16") else f"{self.scheme.name} g{self.group_size}"
        return self.scheme.name

    def matrix_bytes(self, rows: int, cols: int, *, owns_g_idx: bool = True) -> int:
        """Resident bytes of one quantized ``rows x cols`` projection (values, scales, zeros, g_idx).

        ``owns_g_idx=False`` for a projection vLLM fuses with a preceding one of the same input
        (``k_proj``/``v_proj`` into ``qkv_proj``, ``up_proj`` into ``gate_up_proj``): the fused layer
        keeps one act-order index pair for its input features, not one per part.
        """
        values = math.ceil(rows * cols * self.value_bits / 8)
        kind = self.scheme.scale
        scale_bytes = self.scheme.scale_bytes or _MODEL_DTYPE_BYTES
        if kind == "group":
            group = cols if not self.group_size or self.group_size < 0 else self.group_size
            scales = rows * math.ceil(cols / group)
        elif kind == "channel":
            scales = rows
        elif kind == "block":
            b0, b1 = self.block
            scales = math.ceil(rows / b0) * math.ceil(cols / b1)
        else:  # tensor
            scales = 1
        zeros = math.ceil(scales * self.zero_bits / 8) if kind == "group" else 0
        g_idx = 2 * cols * 4 if self.act_order and owns_g_idx else 0
        return values + scales * scale_bytes + zeros + g_idx + 4 * self.fp32_per_matrix

    def skips(self, module: str) -> bool:
        """Whether the module (a vLLM-style dotted name such as ``model.layers.0.mlp.down_proj``) stays 16-bit."""
        if self.only and not any(m in module for m in self.only):
            return True
        for pattern in self.ignore:
            if self.ignore_style == "exact":
                if pattern.startswith("re:"):
                    if re.fullmatch(pattern[3:], module):
                        return True
                elif pattern == module or module.endswith("." + pattern) and "." not in pattern:
                    return True
            elif self.ignore_style == "glob":
                if fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*") \
                        or module.endswith("." + pattern) or module == pattern:
                    return True
            elif pattern in module:
                return True
        return False


def _int(quant: Mapping, *keys: str, default=None):
    for k in keys:
        if k in quant and quant[k] is not None:
            v = quant[k]
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"quantization_config.{k} must be an integer, got {v!r}.")
            return v
    if default is not None:
        return default
    raise ConfigError(f"quantization_config lacks {keys[0]!r} (an integer); copy the checkpoint's config.json.")


def _ct_weights(quant: Mapping) -> tuple[Mapping, Mapping | None]:
    groups = quant.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ConfigError("compressed-tensors quantization_config lacks config_groups; copy the checkpoint's "
                          "config.json.")
    found = []
    for name, group in groups.items():
        targets = group.get("targets") or []
        if "Linear" not in targets and not any("Linear" in str(t) for t in targets):
            raise ConfigError(f"compressed-tensors config group {name!r} targets {targets!r}; only groups "
                              "targeting Linear are modelled.")
        if not isinstance(group.get("weights"), Mapping):
            raise ConfigError(f"compressed-tensors config group {name!r} has no weights scheme; only "
                              "weight-quantized groups are modelled.")
        found.append((group["weights"], group.get("input_activations")))
    if len(found) > 1:
        raise ConfigError(f"compressed-tensors config with {len(found)} config_groups is not modelled (mixed "
                          "schemes per layer); a single group targeting Linear is.")
    return found[0]


def _compressed_tensors(quant: Mapping, s: dict[str, Scheme]) -> Quantization:
    weights, acts = _ct_weights(quant)
    bits, kind = weights.get("num_bits"), weights.get("type", "int")
    strategy, group = weights.get("strategy"), weights.get("group_size")
    ignore = tuple(quant.get("ignore") or ())
    common = dict(method="compressed-tensors", ignore=ignore, ignore_style="exact")
    if kind == "float" and bits == 4 and group == 16:
        return Quantization(s["nvfp4"], value_bits=4, group_size=16, fp32_per_matrix=2, **common)
    if kind == "float" and bits == 8:
        static = 1 if acts and not acts.get("dynamic", True) else 0
        if strategy == "block":
            block = weights.get("block_structure") or [128, 128]
            return Quantization(s["fp8_block"], value_bits=8, block=(int(block[0]), int(block[1])),
                                fp32_per_matrix=static, **common)
        if strategy == "tensor":
            return Quantization(s["fp8_tensor"], value_bits=8, fp32_per_matrix=1 + static, **common)
        if strategy == "channel":
            return Quantization(s["fp8_channel"], value_bits=8, fp32_per_matrix=static, **common)
    if kind == "int" and bits in (4, 8):
        if acts is None and strategy in ("group", "channel"):  # weight-only: WNA16 (pack-quantized)
            zero_bits = 0 if weights.get("symmetric", True) else bits
            return Quantization(s["wna16"], value_bits=bits, group_size=group if strategy == "group" else -1,
                                zero_bits=zero_bits, act_order=weights.get("actorder") == "group" and strategy == "group",
                                dynamic_order=weights.get("actorder") == "dynamic" and strategy == "group",
                                **common)
        if bits == 8 and acts is not None and strategy in ("channel", "tensor"):
            static = 1 if not acts.get("dynamic", True) else 0
            if strategy == "tensor":
                return Quantization(s["int8_channel"], value_bits=8, fp32_per_matrix=1 + static, **common)
            return Quantization(s["int8_channel"], value_bits=8, fp32_per_matrix=static, **common)
    raise ConfigError(
        f"compressed-tensors weights {{type: {kind!r}, num_bits: {bits!r}, strategy: {strategy!r}}} are not "
        "modelled; modelled: W8A8 int8 (channel/tensor), FP8 (tensor/channel/block), W4A16 and W8A16 "
        "(group/channel, pack-quantized), NVFP4 (float, 4 bits, group 16).")


def resolve(quant: Mapping | None) -> Quantization | None:
    """The :class:`Quantization` a ``quantization_config`` describes (None: a 16-bit checkpoint).

    Raises:
        ConfigError: a ``quant_method`` or setting no release servebook checks loads (asymmetric GPTQ,
            AWQ other than 4 bits) or that servebook does not model; the message says what is.
    """
    if not quant:
        return None
    if not isinstance(quant, Mapping):
        raise ConfigError(f"quantization_config must be an object, got {type(quant).__name__}.")
    s = schemes()
    method = str(quant.get("quant_method", "")).lower()
    if method == "awq":
        bits = _int(quant, "bits", "w_bit")
        if bits != 4:
            raise ConfigError(f"AWQ with {bits} bits does not load on {_READ_IN} (AutoAWQConfig supports 4 "
                              "bits only); use a 4-bit AWQ checkpoint.")
        return Quantization(s["awq"], method, 4, group_size=_int(quant, "group_size", "q_group_size"),
                            zero_bits=4 if quant.get("zero_point", True) else 0,
                            lm_head=bool(quant.get("lm_head", False)),
                            ignore=tuple(quant.get("modules_to_not_convert") or ()))
    if method == "gptq":
        bits = _int(quant, "bits")
        sym = quant.get("sym", True)
        if bits not in (4, 8) or not sym:
            raise ConfigError(f"GPTQ bits={bits}, sym={sym} does not load on {_READ_IN} (AutoGPTQConfig "
                              "supports symmetric 4- and 8-bit only); use a symmetric (sym: true) 4- or 8-bit "
                              "GPTQ checkpoint.")
        group = _int(quant, "group_size")
        act_order = bool(quant.get("desc_act", False)) and group != -1  # one group: order is irrelevant
        listed = quant.get("modules_in_block_to_quantize") or ()
        only = tuple(m for entry in listed for m in (entry if isinstance(entry, (list, tuple)) else [entry]))
        return Quantization(s["gptq"], method, bits, group_size=group, act_order=act_order,
                            lm_head=bool(quant.get("lm_head", False)), only=only)
    if method == "fp8":
        block = quant.get("weight_block_size")
        static = 1 if quant.get("activation_scheme") == "static" else 0
        ignore = tuple(quant.get("modules_to_not_convert") or quant.get("ignored_layers") or ())
        if block:
            if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0
                                                                                for b in block)):
                raise ConfigError(f"quantization_config.weight_block_size {block!r} must be two positive "
                                  "integers [rows, cols].")
            return Quantization(s["fp8_block"], method, 8, block=(block[0], block[1]),
                                fp32_per_matrix=static, ignore=ignore)
        return Quantization(s["fp8_tensor"], method, 8, fp32_per_matrix=1 + static, ignore=ignore)
    if method == "mxfp4":
        return Quantization(s["mxfp4"], method, 4, group_size=32, experts_only=True,
                            ignore=tuple(quant.get("modules_to_not_convert") or ()))
    if method == "compressed-tensors":
        return _compressed_tensors(quant, s)
    if method in ("modelopt", "modelopt_fp4"):
        algo = str(quant.get("quant_algo", "")).upper()
        exclude = tuple(quant.get("exclude_modules") or quant.get("ignore") or ())
        if algo == "NVFP4":
            return Quantization(s["nvfp4"], method, 4, group_size=16, fp32_per_matrix=2, ignore=exclude,
                                ignore_style="glob")
        if algo == "FP8":  # ModelOptFp8Config.get_min_capability() is 80 where Fp8Config's is 75
            return Quantization(replace(s["fp8_tensor"], min_compute_capability=8.0), method, 8,
                                fp32_per_matrix=2, ignore=exclude, ignore_style="glob")
        raise ConfigError(f"ModelOpt quant_algo {algo!r} is not modelled; modelled: NVFP4, FP8.")
    raise ConfigError(
        f"quantization_config.quant_method {method!r} is not modelled; supported: awq, gptq, fp8, "
        "compressed-tensors, modelopt (NVFP4, FP8), mxfp4 (or remove quantization_config for a 16-bit "
        "checkpoint).")


def check_loads(quantization: Quantization, vllm_version: str | None = None) -> None:
    """Refuse a checkpoint ``vllm_version`` (None: the pinned release) does not load.

    Group activation ordering loads on 0.26.0 (and 0.27.1) but is refused from 0.32.0 on
    (:func:`servebook.vllm_rules.act_order_loads`).

    Raises:
        ServebookError: naming the setting, the release, and what to use instead.
    """
    if not (quantization.act_order or quantization.dynamic_order) or act_order_loads(vllm_version):
        return
    setting = ("desc_act: true" if quantization.method == "gptq" else
               f"actorder: {'group' if quantization.act_order else 'dynamic'}")
    raise ServebookError(
        f"{quantization.name} with group activation ordering ({setting}) does not load on vLLM "
        f"{vllm_version or rule_release(None)}: from 0.32.0 on vLLM refuses it (\"no longer supported\"); use "
        f"a checkpoint quantized without it, or --vllm-version {RULE_RELEASES[0]} for a release that loads it")


@dataclass(frozen=True)
class KernelChoice:
    """How a GPU runs a scheme: the kernel, and whether it is the native one."""

    kernel: str
    native: bool
    compute_capability: float
    note: str = ""


def kernel_on(quantization: Quantization, gpu_name: str, capability: float | None = None) -> KernelChoice:
    """The kernel vLLM picks for ``quantization`` on a GPU, by compute capability (0.26.0 to 0.34.0 alike).

    ``capability`` overrides the catalogue's figure (for a GPU not in it).

    Raises:
        ServebookError: the GPU is below the scheme's minimum compute capability (vLLM refuses to
            load the checkpoint); the message says what to change.
    """
    scheme = quantization.scheme
    cc = compute_capability(gpu_name) if capability is None else float(capability)
    if cc < scheme.min_compute_capability:
        raise ServebookError(
            f"{gpu_name} (compute capability {cc:.1f}) cannot run {scheme.description}: {_READ_IN} need "
            f"compute capability >= {scheme.min_compute_capability:.1f} for it; use a newer GPU or a 16-bit "
            "(or another quantized) checkpoint of the model.")
    if cc >= scheme.native_compute_capability:
        return KernelChoice(scheme.kernel, True, cc)
    return KernelChoice(
        scheme.fallback_kernel, False, cc,
        note=(f"{gpu_name} (compute capability {cc:.1f}) lacks the native kernel (needs >= "
              f"{scheme.native_compute_capability:.1f}); vLLM runs {scheme.fallback_kernel}: same weight "
              "memory, step time not modelled"))
