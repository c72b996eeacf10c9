"""Tuned configs shipped as JSON (moe_lab/configs/), keyed by device name, Triton version and layer shape.
Empty until `moe-lab tune` has written tables for a device; `lookup` then returns None."""
from __future__ import annotations

from typing import Optional

import torch


def lookup(num_tokens: int, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
           dtype: torch.dtype):
    """The tuned MoEConfig for this device and shape, or None."""
    return None
