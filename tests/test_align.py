import pytest
import torch

from moe_lab import moe_align, moe_align_reference
from moe_lab.align import max_num_tokens_padded

from .conftest import DEVICE, random_topk_ids

pytestmark = pytest.mark.kernels  # the kernel subset, run under every supported Triton (make test-matrix)

FIELDS = ("counts", "sorted_token_ids", "expert_ids", "num_tokens_post_padded")


def assert_same(got, want):
    for f in FIELDS:
        assert torch.equal(getattr(got, f).cpu(), getattr(want, f).cpu()), (
            f"{f}: {getattr(got, f)} != {getattr(want, f)}"
        )


@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,block_size_m",
    [
        (0, 4, 2, 16),
        (1, 1, 1, 16),
        (1, 256, 8, 16),
        (5, 3, 3, 16),
        (17, 7, 2, 16),
        (64, 8, 2, 32),
        (129, 60, 4, 16),
        (300, 128, 8, 64),
        (1000, 5, 1, 16),
        (70, 33, 33, 16),
        (2, 1024, 1, 16),
    ],
)
def test_matches_reference(num_tokens, num_experts, top_k, block_size_m):
    ids = random_topk_ids(num_tokens, num_experts, top_k)
    assert_same(moe_align(ids, num_experts, block_size_m), moe_align_reference(ids, num_experts, block_size_m))


def test_docstring_example():
    """The worked example in moe_align's docstring runs and prints what it says."""
    import doctest

    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(moe_align, "moe_align"):
        runner.run(test)
    assert runner.summarize(verbose=False).attempted >= 4 and runner.failures == 0


def test_one_expert_pads_to_a_block():
    ids = torch.zeros(4, 1, dtype=torch.int32, device=DEVICE)
    r = moe_align(ids, 1, 8)
    assert r.sorted_token_ids.tolist() == [0, 1, 2, 3, 4, 4, 4, 4]
    assert r.expert_ids.tolist() == [0]
    assert r.num_tokens_post_padded.item() == 8 and r.counts.tolist() == [4]


def test_every_token_on_one_expert_and_empty_experts():
    counts = [162, 0, 2577, 446, 0, 83]
    ids = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel())].view(-1, 1).to(torch.int32).to(DEVICE)
    r = moe_align(ids, len(counts), 64)
    assert r.counts.tolist() == counts
    assert_same(r, moe_align_reference(ids, len(counts), 64))
    one = torch.full((500, 1), 3, dtype=torch.int32, device=DEVICE)
    assert_same(moe_align(one, 6, 16), moe_align_reference(one, 6, 16))


def test_unused_blocks_are_minus_one_and_padding_is_sentinel():
    ids = random_topk_ids(10, 16, 2)
    r = moe_align(ids, 16, 16)
    used = r.num_tokens_post_padded.item()
    assert (r.expert_ids[used // 16 :] == -1).all()
    assert (r.expert_ids[: used // 16] >= 0).all()
    assert (r.sorted_token_ids[used:] == 20).all()
    real = r.sorted_token_ids[r.sorted_token_ids < 20]
    assert sorted(real.tolist()) == list(range(20))  # every slot exactly once


@pytest.mark.parametrize("num_slots,num_experts,block_size_m", [(0, 8, 16), (4, 1, 8), (8, 256, 16), (1000, 7, 64)])
def test_buffer_bound_is_tight_and_safe(num_slots, num_experts, block_size_m):
    bound = max_num_tokens_padded(num_slots, num_experts, block_size_m)
    # The worst case: one slot on each of min(E, slots) experts, the rest on expert 0.
    used = min(num_experts, num_slots)
    worst = [1] * used
    if used:
        worst[0] += num_slots - used
    need = sum(-(-c // block_size_m) * block_size_m for c in worst)
    assert bound == need


def test_stable_order_and_determinism():
    ids = random_topk_ids(200, 12, 3)
    a, b = moe_align(ids, 12, 16), moe_align(ids, 12, 16)
    assert_same(a, b)
    r = moe_align_reference(ids, 12, 16)
    assert_same(a, r)


def test_repr_gives_the_sizes_not_the_tensors():
    """(From a new user's trial) printing a routing, or a FusedMoEInfo that holds one, printed its tensors: a
    device read, and screens of numbers."""
    routing = moe_align(random_topk_ids(200, 12, 3), 12, 16)
    text = repr(routing)
    assert text.startswith("AlignedRouting(num_tokens=200, top_k=3, num_experts=12, block_size_m=16, ")
    assert f"max_num_tokens_padded={routing.max_num_tokens_padded}" in text and "tensor(" not in text


def test_expert_map_keeps_local_experts_only():
    ids = random_topk_ids(50, 8, 2)
    expert_map = torch.tensor([-1, 0, -1, 1, 2, -1, -1, 3], dtype=torch.int32, device=DEVICE)
    got = moe_align(ids, 4, 16, expert_map=expert_map)
    assert_same(got, moe_align_reference(ids, 4, 16, expert_map=expert_map))
    assert got.counts.sum().item() == torch.isin(ids.cpu(), torch.tensor([1, 3, 4, 7])).sum().item()


def test_int64_ids_and_noncontiguous():
    ids = random_topk_ids(40, 9, 4).long()
    view = ids.t().contiguous().t()  # same values, transposed strides
    assert not view.is_contiguous()
    assert_same(moe_align(view, 9, 16), moe_align_reference(ids, 9, 16))


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        ((torch.zeros(4, dtype=torch.int32), 4, 16), {}, ValueError, "topk_ids must have 2 dimensions"),
        ((torch.zeros(4, 2), 4, 16), {}, TypeError, "topk_ids must be int32 or int64"),
        ((torch.zeros(4, 2, dtype=torch.int32), 0, 16), {}, ValueError, "num_experts must be >= 1"),
        ((torch.zeros(4, 2, dtype=torch.int32), 4, 24), {}, ValueError, "block_size_m must be a power of two"),
        ((torch.zeros(4, 2, dtype=torch.int32), 4.0, 16), {}, TypeError, "num_experts must be an int"),
        (([[0, 1]], 4, 16), {}, TypeError, "topk_ids must be a torch.Tensor"),
    ],
)
def test_bad_input(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        moe_align(*args, **kwargs)


@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,block_size_m",
    [
        (1, 8, 2, 16),
        (8, 128, 8, 16),
        (4, 256, 8, 32),
        (16, 8, 8, 64),
        (42, 3, 3, 16),
        (12, 512, 5, 128),
    ],
)
def test_one_program_align_gives_the_three_kernel_schedule(monkeypatch, num_tokens, num_experts, top_k, block_size_m):
    """Few slots take one launch (`align_in_registers_kernel`); it must give the very same schedule as the
    count, prefix and scatter kernels, with an expert map and with ids out of range too."""
    import moe_lab.align as align

    ids = random_topk_ids(num_tokens, num_experts, top_k)
    assert align.align_in_one_program(num_tokens * top_k, num_experts, block_size_m)
    ids_bad = ids.clone()
    ids_bad.view(-1)[::7] = num_experts + 3  # dropped: counted nowhere
    emap = torch.randperm(num_experts, device=DEVICE).to(torch.int32)
    emap[emap % 3 == 0] = -1
    local = int((emap >= 0).sum())
    cases = [(ids, num_experts, None), (ids_bad, num_experts, None), (ids, max(local, 1), emap if local else None)]
    one = [moe_align(i, e, block_size_m, expert_map=m) for i, e, m in cases]
    monkeypatch.setattr(align, "ONE_PROGRAM_MAX_SLOTS", 0)
    for got, (i, e, m) in zip(one, cases):
        assert_same(got, moe_align(i, e, block_size_m, expert_map=m))
        assert_same(got, moe_align_reference(i, e, block_size_m, expert_map=m))


@pytest.mark.parametrize("seed", range(24))
def test_one_program_align_on_random_routings(seed):
    """The one-program kernel (slot-by-slot comparisons in registers) on random routings the tests above
    do not draw: repeated experts within a token, ids out of range (int64 ones past 2^31 too), expert maps
    with -1 entries, 1 to 128 slots, every BLOCK_SIZE_M; the same schedule as the reference, bit for bit."""
    import moe_lab.align as align

    g = torch.Generator().manual_seed(seed)
    block_size_m = 2 ** int(torch.randint(0, 9, (1,), generator=g))
    top_k = int(torch.randint(1, 9, (1,), generator=g))
    most_tokens = max(
        t
        for t in range(1, align.ONE_PROGRAM_MAX_SLOTS // top_k + 1)
        if align.align_in_one_program(t * top_k, 1, block_size_m)
    )
    num_tokens = int(torch.randint(1, most_tokens + 1, (1,), generator=g))
    num_slots = num_tokens * top_k
    # As many experts as keep the schedule within the one program's M-block bound.
    most = next(
        e for e in range(align.ONE_PROGRAM_MAX_EXPERTS, 0, -1) if align.align_in_one_program(num_slots, e, block_size_m)
    )
    num_experts = int(torch.randint(1, most + 1, (1,), generator=g))
    assert align.align_in_one_program(num_slots, num_experts, block_size_m)
    # Few distinct experts make repeats and full blocks; some ids fall outside [0, E) and are dropped.
    with_map = seed % 3 == 0
    num_ids = num_experts + 3 if with_map else num_experts
    pool = int(torch.randint(1, num_ids + 1, (1,), generator=g))
    ids = torch.randint(0, pool, (num_tokens, top_k), generator=g, dtype=torch.int64)
    ids[torch.rand(ids.shape, generator=g) < 0.1] = num_ids + 1
    ids[torch.rand(ids.shape, generator=g) < 0.05] = -1
    if seed % 2:
        ids[torch.rand(ids.shape, generator=g) < 0.05] = 2**32 + 1  # wraps to 1 if narrowed first
        ids = ids.to(DEVICE)
    else:
        ids = ids.to(torch.int32).to(DEVICE)
    emap = None
    if with_map:  # num_ids global experts onto num_experts local ones, three of them elsewhere (-1)
        emap = torch.cat([torch.randperm(num_experts, generator=g), torch.full((3,), -1)])
        emap = emap[torch.randperm(num_ids, generator=g)].to(torch.int32).to(DEVICE)
    assert_same(
        moe_align(ids, num_experts, block_size_m, expert_map=emap),
        moe_align_reference(ids, num_experts, block_size_m, expert_map=emap),
    )
