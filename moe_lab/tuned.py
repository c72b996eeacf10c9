"""Tuned configs shipped as JSON in moe_lab/configs/, one file per device and Triton version.

File `moe_lab/configs/<device>__triton-<version>.json` (device name with spaces as '_'):
    {"device": "NVIDIA H200", "triton": "3.6.0",
     "shapes": {"E=8,k=2,H=4096,I=14336,bfloat16": {"1": {"up": {GemmConfig fields}, "down": {...}}, "64": ...}}}
Token counts are buckets: a call with T tokens takes the bucket nearest to T on a log scale.
`moe-lab tune` writes these files; `lookup` reads them (cached) and returns None where none applies.
"""
from __future__ import annotations

import functools
import json
import math
import os
from typing import Optional

import torch

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")


def shape_key(num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> str:
    return f"E={num_experts},k={top_k},H={hidden_size},I={intermediate_size},{str(dtype).replace('torch.', '')}"


def config_path(device_name: str, triton_version: str) -> str:
    return os.path.join(CONFIG_DIR, f"{device_name.replace(' ', '_')}__triton-{triton_version}.json")


@functools.lru_cache(maxsize=None)
def _load(path: str) -> Optional[dict]:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


@functools.lru_cache(maxsize=None)
def _device_table(device_index: int) -> Optional[dict]:
    import triton
    return _load(config_path(torch.cuda.get_device_name(device_index), triton.__version__))


def nearest_bucket(num_tokens: int, buckets) -> str:
    return min(buckets, key=lambda b: abs(math.log(max(num_tokens, 1)) - math.log(max(int(b), 1))))


def lookup(num_tokens: int, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
           dtype: torch.dtype):
    """The tuned MoEConfig for the current CUDA device, this Triton and this shape, or None."""
    from .runtime import interpreter_active
    if interpreter_active() or not torch.cuda.is_available():
        return None
    from .configs import GemmConfig, MoEConfig
    table = _device_table(torch.cuda.current_device())
    if not table:
        return None
    by_tokens = table["shapes"].get(shape_key(num_experts, top_k, hidden_size, intermediate_size, dtype))
    if not by_tokens:
        return None
    entry = by_tokens[nearest_bucket(num_tokens, by_tokens)]
    return MoEConfig(GemmConfig(**entry["up"]), GemmConfig(**entry["down"]))
