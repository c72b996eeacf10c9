"""Timing helpers: refused where times would mean nothing; the cost model is plain arithmetic."""

import pytest

from moe_lab import get_preset
from moe_lab.tools import timing

from ..conftest import ON_GPU


@pytest.mark.skipif(ON_GPU, reason="checks the refusal without a GPU")
@pytest.mark.parametrize(
    "call",
    [lambda: timing.median_ms(lambda: None), lambda: timing.graph_ms(lambda: None), lambda: timing.measure_ceilings()],
)
def test_timing_refuses_the_interpreter_with_the_bench_message(call):
    with pytest.raises(RuntimeError, match="refused: no CUDA GPU is visible to PyTorch"):
        call()


def test_gemm_costs_count_flops_and_fewest_bytes():
    p = get_preset("mixtral-8x7b")
    up, down = timing.gemm_costs(p, 1, experts_used=2, itemsize=2)
    assert up.flops == 2 * 2 * p.hidden_size * 2 * p.intermediate_size
    assert down.flops * 2 == up.flops
    assert up.bytes > 2 * 2 * 2 * p.intermediate_size * p.hidden_size  # both experts' w1 at least
    assert up.roofline_ms({"bf16_matmul_tflops": 1e3, "copy_tbps": 1.0}) == pytest.approx(up.bytes / 1e9)


def test_the_no_gpu_refusal_says_whether_the_interpreter_runs_kernels(monkeypatch):
    """With the interpreter off there is no interpreter to run kernels: the refusal must not say there is."""
    import torch

    from moe_lab.runtime import require_gpu_timing

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError) as exc:
        require_gpu_timing("moe-lab bench")
    assert "Triton's interpreter is off too: TRITON_INTERPRET='0'" in str(exc.value)
    assert "run only under Triton's interpreter" not in str(exc.value)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="here kernels run only under Triton's interpreter"):
        require_gpu_timing("moe-lab bench")
