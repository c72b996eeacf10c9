"""Launch configurations of the grouped matmul: what they are, and a default for any shape.

A `GemmConfig` holds the block shape (BLOCK_SIZE_M/N/K), the tile order (GROUP_SIZE_M) and Triton's
`num_warps` / `num_stages`. A fused layer runs two GEMMs (up: N = 2I, K = H; down: N = H, K = I) that
share one BLOCK_SIZE_M, because both read the same aligned schedule; `MoEConfig` holds the pair.

`heuristic_config` picks by the expected rows per expert, T*k/E: few rows (decode) means the GEMMs stream
weights and want many small-M programs; many rows (prefill) means they are matrix-bound and want large
tiles. What a layer runs with, a tuned table's entry or else this heuristic, is decided in
`moe_lab.tuned` (`choose_config`, `default_config`), which builds on this module; this module knows
nothing of tuned tables.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Mapping, Union

import torch

from ._validate import check_bool, check_positive_int, check_power_of_two
from .runtime import interpreter_active

MAX_STAGES = 16


@dataclass(frozen=True)
class GemmConfig:
    """Block shape and launch parameters of one grouped matmul. BLOCK_SIZE_M/N/K: powers of two from 16 to
    256 (the largest TMA box); GROUP_SIZE_M a power of two up to 1024; num_warps a power of two up to 32;
    num_stages 1 to 16 (MAX_STAGES). Raises TypeError/ValueError naming the field otherwise.
    `tma`: with use_tma="auto", take the TMA path where it is available (tuning may find pointer loads
    faster for a shape).
    `tail_tiles`: run an expert's last M-block as a half or quarter tile (not below 16 rows) when its
    valid rows fit, instead of multiplying padding rows (see `moe_lab/_kernels/grouped_matmul.py`).
    `fuse_swiglu`: in the layer's up projection, apply SiLU-and-mul in the GEMM's epilogue
    (`grouped_matmul(..., swiglu=True)`) instead of a separate kernel over a [rows, 2I] buffer. BLOCK_SIZE_N
    still counts the weight rows a program reads, half gate and half up, so a tile costs the same either
    way; a tile of BLOCK_SIZE_N = 16 cannot be halved and runs unfused (see `swiglu_epilogue`). Fused and
    unfused round differently (the fused path never rounds gate and up to the output dtype): keep one
    setting for every token count, or a token's output changes with its batch.
    `persistent`: launch one program per SM that walks the tiles (`grouped_matmul_persistent_kernel`),
    software-pipelined across tiles so one tile's epilogue overlaps the next one's loads; tiles then run
    whole (no tail tiles). Same results, bit for bit. A slot-order schedule (one token in the layer)
    runs one program per tile instead: its blocks may name no expert.
    `fold_tail_rows`: where an expert's last M-block holds at most this many valid rows, the expert's
    block before it computes them too, in a second dot on the same weight tile, and the last block's
    program does nothing: a small tail costs that many rows' MMAs and no second pass over the weights.
    0 (off) or a power of two from 16 to BLOCK_SIZE_M/2; float operands and one program per tile only
    (the launch plan turns it off elsewhere, `LaunchPlan.config` then shows 0). A dict config that changes
    BLOCK_SIZE_M alone drops a default's fold (it was for that default's block). Same results, bit for bit."""

    BLOCK_SIZE_M: int = 64
    BLOCK_SIZE_N: int = 64
    BLOCK_SIZE_K: int = 64
    GROUP_SIZE_M: int = 8
    num_warps: int = 4
    num_stages: int = 3
    tma: bool = True
    tail_tiles: bool = True
    fuse_swiglu: bool = True
    persistent: bool = False
    fold_tail_rows: int = 0

    def __post_init__(self):
        # Block dims of at most 256: the TMA box limit, and far past what fits in shared memory anyway.
        # Stored as Python ints (numpy integers are taken too): the kernels specialize on them.
        checked = {
            name: check_power_of_two(f"config.{name}", getattr(self, name), minimum=16, maximum=256)
            for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K")
        }
        # GROUP_SIZE_M x N-tiles is an int32 in the kernel; no pipeline deeper than 16 stages fits shared memory.
        checked["GROUP_SIZE_M"] = check_power_of_two("config.GROUP_SIZE_M", self.GROUP_SIZE_M, minimum=1, maximum=1024)
        checked["num_warps"] = check_power_of_two("config.num_warps", self.num_warps, minimum=1, maximum=32)
        checked["num_stages"] = check_positive_int("config.num_stages", self.num_stages)
        if checked["num_stages"] > MAX_STAGES:
            raise ValueError(f"config.num_stages must be <= {MAX_STAGES}, got {checked['num_stages']}")
        checked["fold_tail_rows"] = check_power_of_two(
            "config.fold_tail_rows", self.fold_tail_rows, minimum=16, zero_means="off"
        )
        if checked["fold_tail_rows"]:
            if checked["BLOCK_SIZE_M"] < 32:
                raise ValueError(
                    f"config.fold_tail_rows needs BLOCK_SIZE_M >= 32 (folded rows are 16 at least and "
                    f"half a block at most), got BLOCK_SIZE_M={checked['BLOCK_SIZE_M']}"
                )
            if checked["fold_tail_rows"] > checked["BLOCK_SIZE_M"] // 2:
                raise ValueError(
                    f"config.fold_tail_rows must be 0 or at most BLOCK_SIZE_M/2 = "
                    f"{checked['BLOCK_SIZE_M'] // 2}, got {checked['fold_tail_rows']}"
                )
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # frozen dataclass
        for name in ("tma", "tail_tiles", "fuse_swiglu", "persistent"):
            check_bool(f"config.{name}", getattr(self, name))

    @property
    def swiglu_epilogue(self) -> bool:
        """Whether a layer's up projection with this config applies SiLU-and-mul in its epilogue."""
        return self.fuse_swiglu and self.BLOCK_SIZE_N >= 32

    @property
    def tail_splits(self) -> int:
        """How many times the kernel may halve BLOCK_SIZE_M for a tail block: at most twice, not below 16."""
        if not self.tail_tiles:
            return 0
        return min(2, (self.BLOCK_SIZE_M // 16).bit_length() - 1)

    def shared_memory_bytes(self, itemsize: int) -> int:
        """Shared memory the software pipeline needs for A and W tiles (Triton's estimate, roughly), a
        folded tail's rows counted as A rows."""
        tile = (self.BLOCK_SIZE_M + self.fold_tail_rows + self.BLOCK_SIZE_N) * self.BLOCK_SIZE_K * itemsize
        return tile * max(1, self.num_stages - 1) + tile

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MoEConfig:
    """The two GEMMs of a layer; they must share BLOCK_SIZE_M (one alignment serves both)."""

    up: GemmConfig
    down: GemmConfig

    def __post_init__(self):
        for name in ("up", "down"):
            if not isinstance(getattr(self, name), GemmConfig):
                raise TypeError(f"MoEConfig.{name} must be a GemmConfig, got {type(getattr(self, name)).__name__}")
        if self.up.BLOCK_SIZE_M != self.down.BLOCK_SIZE_M:
            raise ValueError(
                f"config: up and down must share BLOCK_SIZE_M, got {self.up.BLOCK_SIZE_M} and {self.down.BLOCK_SIZE_M}"
            )

    @property
    def block_size_m(self) -> int:
        return self.up.BLOCK_SIZE_M


def fit_to_shared_memory(config: GemmConfig, itemsize: int, limit: int) -> GemmConfig:
    """`config` with num_stages lowered until its pipeline fits `limit` bytes of shared memory (a config
    tuned on a bigger GPU must not crash a smaller one). Raises ValueError if one stage does not fit."""
    while config.shared_memory_bytes(itemsize) > limit and config.num_stages > 1:
        config = replace(config, num_stages=config.num_stages - 1)
    if config.shared_memory_bytes(itemsize) > limit:
        raise ValueError(
            f"config {config} needs {config.shared_memory_bytes(itemsize)} bytes of shared memory "
            f"even with one stage; the device allows {limit}: use smaller BLOCK_SIZE_M/N/K"
        )
    return config


ConfigLike = Union[GemmConfig, MoEConfig, Mapping, None]


def _merged(base: GemmConfig, changes, where: str) -> GemmConfig:
    """`base` with the fields in `changes` (a GemmConfig replaces it whole; a dict changes some fields)."""
    if isinstance(changes, GemmConfig):
        return changes
    if not isinstance(changes, Mapping):
        raise TypeError(f"{where} must be a GemmConfig or a dict, got {type(changes).__name__}")
    unknown = sorted(set(changes) - set(GemmConfig.__dataclass_fields__))
    if unknown:
        also = " (or only 'up' and 'down', each a dict of these)" if where == "config" else ""
        raise TypeError(
            f"{where} has unknown key(s) {unknown}; expected some of {list(GemmConfig.__dataclass_fields__)}{also}"
        )
    if "BLOCK_SIZE_M" in changes and "fold_tail_rows" not in changes:  # the default's fold was for its own block
        changes = dict(changes, fold_tail_rows=0)
    try:
        return replace(base, **changes)
    except (TypeError, ValueError) as exc:  # a field it left may be what fails: say whose
        raise type(exc)(f"{exc} ({where} changes the default {base})") from None


def as_moe_config(config: ConfigLike, default: MoEConfig) -> MoEConfig:
    """Accept a MoEConfig, one GemmConfig for both GEMMs, a dict of GemmConfig fields changed on top of
    `default` (for both GEMMs, or per GEMM under "up" / "down"), or None for `default`.
    Raises TypeError/ValueError naming the key or field at fault."""
    if config is None:
        return default
    if isinstance(config, MoEConfig):
        return config
    if isinstance(config, GemmConfig):
        return MoEConfig(config, config)
    if isinstance(config, Mapping):
        if "up" in config or "down" in config:
            extra = sorted(set(config) - {"up", "down"})
            if extra:
                raise TypeError(f"config with 'up'/'down' entries takes no other keys, got {extra}")
            return MoEConfig(
                _merged(default.up, config.get("up", {}), "config['up']"),
                _merged(default.down, config.get("down", {}), "config['down']"),
            )
        return MoEConfig(_merged(default.up, config, "config"), _merged(default.down, config, "config"))
    raise TypeError(f"config must be a MoEConfig, GemmConfig, dict or None, got {type(config).__name__}")


def full_precision_fp32(dtype: torch.dtype) -> bool:
    """True when float32 operands multiply at full precision (PyTorch's "highest" float32 matmul precision,
    its default): `tl.dot(..., input_precision="ieee")`, on the CUDA cores. "high" allows TF32 tensor cores."""
    return dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest"


LAYER_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)


def check_layer_shape(
    num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype
) -> tuple[int, int, int, int, int]:
    """The sizes a config is chosen by, as Python ints: num_tokens, hidden_size and intermediate_size >= 0 (an
    empty layer has a config too), num_experts and top_k >= 1 (top_k may exceed num_experts: with an
    expert_map a rank's local experts are fewer than a token's k). Raises TypeError / ValueError naming the
    argument, TypeError for a dtype other than float16, bfloat16, float32 and float8_e4m3fn (the weights')."""
    num_tokens, hidden_size, intermediate_size = (
        check_positive_int(name, value, minimum=0)
        for name, value in (
            ("num_tokens", num_tokens),
            ("hidden_size", hidden_size),
            ("intermediate_size", intermediate_size),
        )
    )
    num_experts, top_k = check_positive_int("num_experts", num_experts), check_positive_int("top_k", top_k)
    if dtype not in LAYER_DTYPES:
        names = ", ".join(str(d)[6:] for d in LAYER_DTYPES)
        raise TypeError(f"dtype must be one of {names} (the weights' dtype), got {dtype!r}")
    return num_tokens, num_experts, top_k, hidden_size, intermediate_size


def heuristic_config(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden_size: int,
    intermediate_size: int,
    dtype: torch.dtype = torch.bfloat16,
) -> MoEConfig:
    """Rules by expected rows per expert (T*k/E), no table: the config where no tuned entry applies.
    Under Triton's interpreter: one small config for every shape. `dtype` matters for float32 at full
    precision (`full_precision_fp32`), whose dots need smaller tiles. Raises as `check_layer_shape`."""
    num_tokens, num_experts, top_k, _, _ = check_layer_shape(
        num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype
    )
    if interpreter_active():
        # The interpreter runs one program at a time: few, wide tiles; M small to keep padding cheap.
        cfg = GemmConfig(16, 64, 64, 1, 4, 1)
        return MoEConfig(cfg, cfg)
    rows_per_expert = num_tokens * top_k / num_experts
    if full_precision_fp32(dtype) and rows_per_expert > 4:
        # Full-precision float32 dots run on the CUDA cores, not the tensor cores: the bf16 prefill tile's
        # 128x256 accumulator spills; a smaller tile with pointer loads measured fastest (docs/experiments.md,
        # "Full-precision float32 tiles").
        cfg = GemmConfig(64, 128, 32, 4, 4, 3, tma=False)
        return MoEConfig(cfg, cfg)
    if rows_per_expert <= 4:
        up = GemmConfig(16, 64, 128, 1, 4, 4)
        down = GemmConfig(16, 64, 128, 1, 4, 4)
    elif rows_per_expert <= 32:
        up = GemmConfig(32, 64, 128, 1, 4, 4)
        down = GemmConfig(32, 64, 128, 1, 4, 4)
    elif rows_per_expert <= 128:
        up = GemmConfig(64, 128, 64, 8, 4, 4)
        down = GemmConfig(64, 128, 64, 8, 4, 4)
    else:
        # The tile that won most prefill points (docs/experiments.md, "bf16 tiles, configs and TMA loads").
        up = GemmConfig(128, 256, 64, 8, 8, 4)
        down = GemmConfig(128, 256, 64, 8, 8, 4)
    if dtype.itemsize == 1:
        # float8 (w8a8): K steps of one 128-channel scale block. Each step's float32 product is scaled and
        # added apart from the sum, two float32 tiles live in registers: tiles of at most 64 x 128 won every
        # point above 16 rows per expert (docs/experiments.md, "FP8 w8a8, block-scaled").
        if rows_per_expert <= 4:
            cfg = GemmConfig(16, 64, 128, 1, 4, 4)
        elif rows_per_expert <= 16:
            cfg = GemmConfig(32, 128, 128, 1, 4, 4)
        else:
            cfg = GemmConfig(64, 128, 128, 8, 4, 4)
        return MoEConfig(cfg, cfg)
    if dtype.itemsize == 4:
        # These tiles are sized in 16-bit elements; float32 (TF32 dots) halves BLOCK_SIZE_K to keep their
        # bytes, so the pipeline fits an A100's shared memory (128x256x64 in float32 did not, at any depth).
        up, down = (replace(c, BLOCK_SIZE_K=max(16, c.BLOCK_SIZE_K // 2)) for c in (up, down))
    return MoEConfig(up, down)
