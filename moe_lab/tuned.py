"""Tuned configs shipped as JSON in moe_lab/configs/, one file per device and Triton version, and the one
place that decides which config a layer runs with (`choose_config`).

File `moe_lab/configs/<device>__triton-<version>.json` (device name with spaces as '_'):
    {"format": 1, "device": "NVIDIA H200", "triton": "3.6.0", "capability": [9, 0],
     "shapes": {"E=8,k=2,H=4096,I=14336,bfloat16": {"1": {"up": {GemmConfig fields}, "down": {...}}, "64": ...}}}
Token counts are buckets: a call with T tokens takes the bucket nearest to T on a log scale.
`moe-lab tune` writes these files. "capability" is the CUDA compute capability (major, minor) of the
device that was tuned (null on ROCm/HIP); a file without it is taken to have the capability of a device
with the same name, and is never used for a device of another name.

Which table serves a device (`select_table`, `table_for_device`), in this order:
1. the exact table: same device name, same Triton version;
2. the same device name with the nearest Triton version;
3. another device of the same compute capability (same architecture, e.g. H100 and H200 are both
   sm_90), nearest Triton version.
Nearest means the smallest difference in major, then minor, then patch version; on a tie the newer
Triton wins, then the device name in alphabetical order. A table of another architecture is never
taken; without one, configs come from `moe_lab.configs.heuristic_config`.

Everything is read once per process and device (cached); a lookup on the hot path touches no file.
`clear_cache()` forgets it all (after writing a table, or in tests).
"""

from __future__ import annotations

import functools
import glob
import json
import math
import os
import warnings
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple, Union

import torch
import triton

from ._validate import check_bool
from .configs import ConfigLike, GemmConfig, MoEConfig, as_moe_config, check_layer_shape, heuristic_config
from .runtime import interpreter_active, version_tuple

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")
# The table layout this moe-lab reads and `moe-lab tune` writes ("format" in the JSON; absent means 1).
# Every entry holds every GemmConfig field, the switches included, as it was tuned.
FORMAT_VERSION = 1

USER_CONFIG = "user config"
HEURISTIC_NO_TABLE = "heuristic (no tuned table for this device)"

Capability = Tuple[int, int]


def shape_key(num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> str:
    """The key of a layer shape in a table, e.g. "E=8,k=2,H=4096,I=14336,bfloat16"."""
    return f"E={num_experts},k={top_k},H={hidden_size},I={intermediate_size},{str(dtype).replace('torch.', '')}"


def config_path(device_name: str, triton_version: str) -> str:
    """The path of the exact table for this device name and Triton version (it need not exist)."""
    return os.path.join(CONFIG_DIR, f"{device_name.replace(' ', '_')}__triton-{triton_version}.json")


def arch_name(capability: Optional[Capability]) -> str:
    """ "sm_90" for (9, 0); "unknown architecture" for None."""
    return f"sm_{capability[0]}{capability[1]}" if capability else "unknown architecture"


@dataclass(frozen=True)
class TunedTable:
    """Which tuned table serves a device, and why.

    `path`: the JSON file, or None when no table serves the device (then `device`, `triton` and
    `capability` are None too and configs come from the heuristic). `device`, `triton`, `capability`:
    what the table was tuned on (`capability` None for a file that does not record it). `exact`: tuned
    on this very device name and Triton version. `reason`: the choice in words, naming this device.
    `summary`: a short description for one line ("NVIDIA H200, Triton 3.6.0 (exact)"). Truthy when a
    table serves."""

    path: Optional[str]
    device: Optional[str]
    triton: Optional[str]
    capability: Optional[Capability]
    exact: bool
    reason: str
    summary: str = "no tuned table"

    def __bool__(self) -> bool:
        return self.path is not None


def _none(reason: str) -> TunedTable:
    return TunedTable(None, None, None, None, False, reason)


@dataclass(frozen=True)
class ConfigChoice:
    """The config a layer runs with and where it came from (`source`): "user config", "user config
    (dict) over <default source>", "tuned: <table summary>, T bucket <n>", or "heuristic (...)"."""

    config: MoEConfig
    source: str


@dataclass(frozen=True)
class _Header:
    path: str
    device: str
    triton: str
    capability: Optional[Capability]


def _version(text: str) -> Tuple[int, int, int]:
    """(major, minor, patch) of a version string such as "3.6.0" or "3.7.0+git1a2b" (missing parts 0)."""
    return (version_tuple(text) + (0, 0, 0))[:3]


def _capability(value, path: str) -> Optional[Capability]:
    if value is None:
        return None
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return int(value[0]), int(value[1])
    raise ValueError(f'{path}: "capability" must be [major, minor] or null, got {value!r}')


@functools.lru_cache(maxsize=None)
def _scan(config_dir: str) -> Tuple[_Header, ...]:
    """The headers of every table in `config_dir` (read once). Files that are not tables are skipped
    with a warning: one broken file must not stop every layer call."""
    headers = []
    for path in sorted(glob.glob(os.path.join(config_dir, "*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
            if not (
                isinstance(data, dict)
                and isinstance(data.get("device"), str)
                and isinstance(data.get("triton"), str)
                and isinstance(data.get("shapes"), dict)
            ):
                raise ValueError('not a table: needs "device", "triton" (strings) and "shapes" (an object)')
            if data.get("format", 1) != FORMAT_VERSION:
                raise ValueError(f"table format {data.get('format')!r}; this moe-lab reads format {FORMAT_VERSION}")
            headers.append(_Header(path, data["device"], data["triton"], _capability(data.get("capability"), path)))
        except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            warnings.warn(f"moe_lab.tuned: skipping {path}: {exc}", stacklevel=2)
    return tuple(headers)


def select_table(
    device_name: str, capability: Optional[Capability], triton_version: str, config_dir: Optional[str] = None
) -> TunedTable:
    """The table that serves a device named `device_name` of compute `capability` ((major, minor), or
    None where unknown, e.g. ROCm/HIP: then only tables of the same name qualify) under Triton
    `triton_version`, from the tables in `config_dir` (default: the package's `CONFIG_DIR`), by the rules
    in this module's docstring. Returns a TunedTable, falsy with the reason when none qualifies. Cached;
    files that are not tables are skipped with a warning. Touches no GPU: it answers for any device."""
    if capability is not None:
        capability = (int(capability[0]), int(capability[1]))
    return _select_table(device_name, capability, triton_version, config_dir or CONFIG_DIR)


@functools.lru_cache(maxsize=None)
def _select_table(
    device_name: str, capability: Optional[Capability], triton_version: str, config_dir: str
) -> TunedTable:
    want = _version(triton_version)
    ranked = []
    for h in _scan(config_dir):
        if h.device == device_name:
            if h.capability is not None and capability is not None and h.capability != capability:
                continue  # same name, another architecture: never
            rank = 0
        elif capability is not None and h.capability == capability:
            rank = 1
        else:
            continue
        have = _version(h.triton)
        distance = tuple(abs(a - b) for a, b in zip(have, want))
        ranked.append(((rank, distance, tuple(-v for v in have), h.device, h.path), h))
    this = f"{device_name} with Triton {triton_version}"
    if not ranked:
        known = "; ".join(f"{h.device} / Triton {h.triton} ({arch_name(h.capability)})" for h in _scan(config_dir))
        return _none(
            f"no tuned table for {device_name} ({arch_name(capability)}) with Triton {triton_version} "
            f"in {config_dir}" + (f" (tables there: {known})" if known else "") + ": configs come from the heuristic"
        )
    h = min(ranked, key=lambda r: r[0])[1]
    tuned_on = f"tuned on {h.device} with Triton {h.triton}"
    cap = h.capability if h.capability is not None else capability
    if h.device == device_name and h.triton == triton_version:
        return TunedTable(
            h.path,
            h.device,
            h.triton,
            h.capability,
            True,
            f"{tuned_on}: this device and this Triton version (exact table)",
            f"{h.device}, Triton {h.triton} (exact)",
        )
    if h.device == device_name:
        return TunedTable(
            h.path,
            h.device,
            h.triton,
            h.capability,
            False,
            f"{tuned_on}; this is {this}: same device, nearest Triton version",
            f"{h.device}, Triton {h.triton} (nearest Triton version)",
        )
    return TunedTable(
        h.path,
        h.device,
        h.triton,
        h.capability,
        False,
        f"{tuned_on}; this is {this}: nearest table of the same architecture ({arch_name(cap)})",
        f"{h.device}, Triton {h.triton} (nearest table of {arch_name(cap)})",
    )


def _device_index(device: Union[torch.device, str, int, None]) -> Optional[int]:
    """The CUDA index of `device` (None: the current device), or None for a device that is not CUDA."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _device_table(index: int, triton_version: str, config_dir: str) -> TunedTable:
    name = torch.cuda.get_device_name(index)
    # ROCm reports its own architecture numbers through this call: match those tables by name only.
    capability = None if getattr(torch.version, "hip", None) else tuple(torch.cuda.get_device_capability(index))
    return select_table(name, capability, triton_version, config_dir)


def table_for_device(device: Union[torch.device, str, int, None] = None) -> TunedTable:
    """Which tuned table serves `device` (a CUDA device, index or string; default: the current one) with
    the installed Triton, and why (see the module docstring for the order). Returns a falsy TunedTable
    with the reason under Triton's interpreter, without a CUDA GPU, or for a device that is not CUDA.
    Cached per device; never raises for a missing or unreadable table (those are skipped with a
    warning)."""
    if interpreter_active():
        return _none(
            "Triton interpreter (TRITON_INTERPRET=1): tuned tables are for GPUs; configs come from the heuristic"
        )
    if not torch.cuda.is_available():
        return _none("no CUDA GPU is visible to PyTorch: configs come from the heuristic")
    index = _device_index(device)
    if index is None:
        return _none(f"device {device} is not a CUDA GPU: configs come from the heuristic")
    return _device_table(index, triton.__version__, CONFIG_DIR)


class _Entries:
    """One shape's token buckets of a table, parsed: (log of the bucket, ConfigChoice) in file order."""

    def __init__(self, by_tokens: Mapping[str, dict], summary: str, where: str):
        self.buckets: List[Tuple[float, ConfigChoice]] = []
        for bucket, entry in by_tokens.items():
            try:
                config = MoEConfig(GemmConfig(**entry["up"]), GemmConfig(**entry["down"]))
                tokens = int(bucket)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(
                    f"{where}, T bucket {bucket}: not a valid entry ({type(exc).__name__}: {exc})"
                ) from exc
            self.buckets.append(
                (math.log(max(tokens, 1)), ConfigChoice(config, f"tuned: {summary}, T bucket {bucket}"))
            )

    def nearest(self, num_tokens: int) -> ConfigChoice:
        log_t = math.log(max(num_tokens, 1))
        return min(self.buckets, key=lambda b: abs(log_t - b[0]))[1]


@functools.lru_cache(maxsize=None)
def _entries(path: str, summary: str) -> Dict[str, _Entries]:
    with open(path) as f:
        shapes = json.load(f)["shapes"]
    return {key: _Entries(by_tokens, summary, f"{path}: {key}") for key, by_tokens in shapes.items() if by_tokens}


def choose_config(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden_size: int,
    intermediate_size: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    config: ConfigLike = None,
    device: Union[torch.device, str, int, None] = None,
) -> ConfigChoice:
    """The config a layer of this shape runs with on `device` (default: the current CUDA device), and
    where it came from. `config` as `fused_moe` takes it: None (the default: the tuned entry of the table
    that `table_for_device` picks, nearest token bucket, else `heuristic_config`), a MoEConfig or a
    GemmConfig (used as given), or a dict of fields changed on top of the default.
    Returns a ConfigChoice. Raises as `moe_lab.configs.check_layer_shape` (sizes, dtype), TypeError/ValueError
    for a malformed `config` (see `moe_lab.configs.as_moe_config`) and ValueError naming the file for a
    malformed table entry. After the first call per device, it reads no file."""
    num_tokens, num_experts, top_k, hidden_size, intermediate_size = check_layer_shape(
        num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype
    )
    if config is not None and not isinstance(config, Mapping):
        return ConfigChoice(as_moe_config(config, None), USER_CONFIG)  # type: ignore[arg-type]
    default = _default_choice(num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype, device)
    if config is None:
        return default
    return ConfigChoice(as_moe_config(config, default.config), f"{USER_CONFIG} (dict) over {default.source}")


def _default_choice(num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype, device) -> ConfigChoice:
    table = table_for_device(device)
    if not table:
        return ConfigChoice(
            heuristic_config(num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype), HEURISTIC_NO_TABLE
        )
    key = shape_key(num_experts, top_k, hidden_size, intermediate_size, dtype)
    entries = _entries(table.path, table.summary).get(key)
    if entries is None:
        return ConfigChoice(
            heuristic_config(num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype),
            f"heuristic (no tuned entry for this shape: {key} is not in the table of "
            f"{table.device}, Triton {table.triton})",
        )
    return entries.nearest(num_tokens)


def default_config(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden_size: int,
    intermediate_size: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    tuned: bool = True,
) -> MoEConfig:
    """The config a layer runs with by default (a MoEConfig): with `tuned`, the entry of the tuned table
    that serves the current CUDA device for this shape and the nearest token bucket if there is one
    (`choose_config` decides, and says which), else `moe_lab.configs.heuristic_config`. Raises as
    `moe_lab.configs.check_layer_shape` (sizes, dtype), TypeError for a `tuned` that is not a bool; a malformed
    tuned table raises ValueError naming its file."""
    shape = check_layer_shape(num_tokens, num_experts, top_k, hidden_size, intermediate_size, dtype)
    check_bool("tuned", tuned)
    if tuned:
        return choose_config(*shape, dtype).config
    return heuristic_config(*shape, dtype)


def clear_cache() -> None:
    """Forget every table read and every choice made, so the next lookup reads the files again (after
    `moe-lab tune` wrote a table in this process, or after changing `CONFIG_DIR`), and the layer plans made
    with them (`moe_lab.plan.clear_layer_plans`)."""
    from .plan import clear_layer_plans  # the plans import this module

    for cached in (_scan, _select_table, _device_table, _entries):
        cached.cache_clear()
    clear_layer_plans()
