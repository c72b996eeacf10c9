"""Integer helpers for host code. Triton's `triton.cdiv` and `triton.next_power_of_2` are constexpr functions
(callable in kernels too), and each call from the host goes through their wrapper: microseconds per call on
the layer's per-call path. These compute the same for Python ints."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n, for n >= 1 (0 for 0, as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
