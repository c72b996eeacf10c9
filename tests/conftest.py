"""Shared fixtures. Importing moe_lab first switches Triton's interpreter on when there is no GPU."""

import pytest
import torch

import moe_lab  # noqa: F401 - first, before any kernel is defined (the interpreter switch)
from moe_lab.runtime import default_device

DEVICE = default_device()
ON_GPU = DEVICE.type == "cuda"


def pytest_addoption(parser):
    parser.addoption(
        "--run-ui",
        action="store_true",
        help="run the browser tests (tests/ui: JupyterLab in headless Chromium; `make test-ui`)",
    )


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on an H200)")
    # The browser tests need playwright and Chromium and take minutes: only on request.
    skip_ui = pytest.mark.skip(reason="browser test: run `make test-ui` (pytest --run-ui)")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)
        if "ui" in item.keywords and not config.getoption("--run-ui"):
            item.add_marker(skip_ui)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def random_topk_ids(num_tokens, num_experts, top_k, *, device=DEVICE, generator=None):
    """[T, k] int32 with k distinct experts per token, uniformly at random."""
    if num_tokens == 0:
        return torch.empty((0, top_k), dtype=torch.int32, device=device)
    scores = torch.rand((num_tokens, num_experts), generator=generator)
    return scores.topk(top_k, dim=1).indices.to(torch.int32).to(device)


def random_layer(num_tokens, num_experts, top_k, hidden, inter, dtype, *, device=DEVICE, ids=None):
    """hidden_states, w1, w2, topk_weights, topk_ids with fresh random values (never zeros)."""
    hs = torch.randn(num_tokens, hidden, device=device).to(dtype)
    w1 = (torch.randn(num_experts, 2 * inter, hidden, device=device) / hidden**0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, device=device) / inter**0.5).to(dtype)
    topk_ids = random_topk_ids(num_tokens, num_experts, top_k, device=device) if ids is None else ids.to(device)
    topk_weights = torch.softmax(torch.randn(num_tokens, top_k, device=device), dim=-1)
    return hs, w1, w2, topk_weights, topk_ids


def small_layer(num_tokens=8, num_experts=4, top_k=2, dtype=torch.float32):
    """A random layer with H = I = 32: quick under the interpreter."""
    return random_layer(num_tokens, num_experts, top_k, 32, 32, dtype)


TOL = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}
