"""The compile-only check (.ci/compile_check.py): Triton compiles kernels for GPUs that are not there.

Each test runs in a child process: this one has Triton's interpreter on (conftest imports moe_lab first),
and the check needs real JITFunctions (TRITON_INTERPRET=0 before any kernel is defined).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A grouped matmul in the sorted layout (the down projection), on meta tensors: A and W both go through
# tensor descriptors where TMA is available.
CHILD = textwrap.dedent("""
    import json
    import torch
    from moe_lab.tools import compile_only as co
    from moe_lab import AlignedRouting, GemmConfig, grouped_matmul
    co.patch_moe_lab()

    def meta(*shape, dtype=torch.int32):
        return torch.empty(shape, dtype=dtype, device="meta")

    E, N, K, BM, ROWS = 8, 256, 512, 64, 1024
    routing = AlignedRouting(meta(E), meta(ROWS), meta(ROWS // BM), meta(1), BM, 256, 2, E)
    a, w = meta(ROWS, K, dtype=torch.bfloat16), meta(E, N, K, dtype=torch.bfloat16)

    def compile_gemm(cc, config, use_tma="auto"):
        session = co.Session(compile_missing=True)
        with co.fake_gpu(cc, session):
            grouped_matmul(a, w, routing, config, gather_a=False, use_tma=use_tma)
        return session

    def ptx(session):
        (kernel,) = [k for k in session.kernels.values() if k.name == "grouped_matmul_kernel"]
        return kernel.asm["ptx"]

    config = GemmConfig(BM, 128, 64, 8, 4, 4)
    tma = compile_gemm(90, config)
    out = {"tma_sm90": "cp.async.bulk.tensor" in ptx(tma),
           "ptr_sm90": "cp.async.bulk.tensor" in ptx(compile_gemm(90, config, use_tma=False)),
           "ptr_sm80": "cp.async.bulk.tensor" in ptx(compile_gemm(80, config))}

    # A kernel that needs more shared memory than the device has raises OutOfResources at launch, and the
    # launcher retries with fewer stages: give the fake H200 one byte less than the 4-stage kernel needs.
    need = max(o["shared"] for o in tma.outcomes.values())
    if config.shared_memory_bytes(2) <= need - 1:  # the launcher's own estimate lets 4 stages through
        co.DEVICES[90] = co.Device("small H200", need - 1, 132)
        retry = compile_gemm(90, config)  # 4 stages: Triton's in-memory cache, then OutOfResources
        out["stages_compiled_on_retry"] = sorted(v.kwargs["num_stages"] for v in retry.order)
    print("RESULT", json.dumps(out))
""")


def run_child(code, **env):
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TRITON_INTERPRET="0", **env),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_tma_copy_only_on_the_tma_path(tmp_path):
    # A cache of its own: a shared one may hold kernels stored without their PTX (TRITON_STORE_BINARY_ONLY).
    out = run_child(CHILD, TRITON_CACHE_DIR=str(tmp_path))
    assert out["tma_sm90"], "sm_90 TMA path: no cp.async.bulk.tensor in the PTX"
    assert not out["ptr_sm90"], "sm_90 with use_tma=False still uses the TMA copy"
    assert not out["ptr_sm80"], "sm_80 (no TMA) uses the TMA copy"
    if "stages_compiled_on_retry" in out:  # too little shared memory for 4 stages: the launcher retried
        assert out["stages_compiled_on_retry"] == [3]


BROKEN_NOTEBOOK = textwrap.dedent("""
    # %%
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def fp8_dot_kernel(a_ptr, c_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :]).to(tl.float8e4nv)
        tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], tl.dot(a, a))


    # %%
    c = torch.empty(32, 32)
    fp8_dot_kernel[(1,)](torch.randn(32, 32), c, BLOCK=32)
""")


def test_a_notebook_kernel_that_does_not_compile_fails_the_check(tmp_path):
    """fp8 e4m3 runs under the interpreter and compiles for sm_90, but sm_80 has no such type."""
    script = tmp_path / "09_fp8.py"
    script.write_text(BROKEN_NOTEBOOK)
    proc = subprocess.run(
        [
            sys.executable,
            ".ci/compile_check.py",
            "--only",
            "notebooks",
            "--notebooks",
            str(script),
            "--targets",
            "80",
            "90",
            "--jobs",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, MOE_LAB_COMPILE_CHECK_CACHE=str(tmp_path / "cache")),
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    fail = [ln for ln in out.splitlines() if ln.startswith("FAIL ")]
    assert len(fail) == 1 and "sm_80 fp8_dot_kernel[BLOCK=32]" in fail[0], out
    assert "fp8e4nv not supported" in out, out
    assert any("sm_90" in ln and "1 kernel variants" in ln and "0 failed" in ln for ln in out.splitlines()), out


def test_look_inside_shows_the_tma_copy_only_on_the_tma_path():
    """moe_lab.tools.look_inside, as notebook 05 uses it: the sm_90 PTX of the TMA path holds TMA copies
    (cp.async.bulk.tensor), the pointer path's and sm_80's hold none, and wrong arguments are refused."""
    from moe_lab.tools import look_inside

    tma = look_inside.compile_grouped_matmul("tma", cc=90)
    assert tma.count("cp.async.bulk.tensor") > 0 and "cp.async.bulk.tensor" in tma.summary()
    assert look_inside.compile_grouped_matmul("pointer", cc=90).count("cp.async.bulk.tensor") == 0
    assert look_inside.compile_grouped_matmul("tma", cc=80).count("cp.async.bulk.tensor") == 0
    with pytest.raises(ValueError, match="load_path"):
        look_inside.compile_grouped_matmul("descriptor")
    with pytest.raises(ValueError, match="cc must be one of"):
        look_inside.compile_grouped_matmul("tma", cc=89)


# The up GEMM's weight loads by pointer for sm_90, with and without the SwiGLU epilogue, over a w1 whose rows
# are H + PAD elements apart: counts of 16-byte cp.async copies and of scalar 2-byte loads in the PTX.
SWIGLU_CHILD = textwrap.dedent("""
    import json, re, sys
    import torch
    from moe_lab.tools import compile_only as co
    from moe_lab import AlignedRouting, GemmConfig, grouped_matmul
    co.patch_moe_lab()

    E, I, H, BM, ROWS, PAD = 8, 512, 256, 128, 1408, int(sys.argv[1])
    meta = lambda *shape, dtype=torch.int32: torch.empty(shape, dtype=dtype, device="meta")
    routing = AlignedRouting(meta(E), meta(ROWS), meta(ROWS // BM), meta(1), BM, 256, 2, E)
    a = meta(ROWS, H, dtype=torch.bfloat16)
    w = meta(E, 2 * I, H + PAD, dtype=torch.bfloat16)[:, :, :H]
    counts = {}
    for swiglu in (False, True):
        session = co.Session(compile_missing=True)
        with co.fake_gpu(90, session):
            grouped_matmul(a, w, routing, GemmConfig(BM, 256, 64, 8, 8, 3), gather_a=False, swiglu=swiglu,
                           use_tma=False)
        (k,) = [k for k in session.kernels.values() if k.name == "grouped_matmul_kernel"]
        ptx = k.asm["ptx"]
        counts[str(swiglu)] = [len(re.findall(r"cp\\.async\\.cg\\.shared\\.global", ptx)), ptx.count("ld.global.b16")]
    print(json.dumps(counts))
""")


@pytest.mark.parametrize("pad", [0, 1])
def test_swiglu_weight_loads_vectorize_as_the_plain_gemm_does(pad):
    """The SwiGLU epilogue's gate/up row indices must keep Triton's alignment analysis right: with rows
    16-byte aligned (pad 0) the weight loads are 16-byte copies, as without the epilogue; with rows H + 1
    elements apart (pad 1) they are scalar loads, as without it. A first version's indices made Triton
    emit 16-byte copies from odd addresses there ("misaligned address" on an H200)."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, "-c", SWIGLU_CHILD, str(pad)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    plain, fused = counts["False"], counts["True"]
    assert fused == plain, counts
    assert (fused[1] > 0) == bool(pad), counts  # scalar loads exactly where the rows are unaligned


def test_fp8_tiles_of_16_rows_run_mma_sync_and_of_64_rows_wgmma():
    """Why FP8 is batch invariant only with one kind of tile at every T (README, batch invariance): on sm_90
    a 16- or 32-row tile multiplies with mma.sync, a 64-row tile with wgmma, and a 64-row config with tail
    tiles holds both; the two round float8 products differently on an H200."""
    code = textwrap.dedent("""
        import json, torch
        from moe_lab.tools import compile_only as co
        from moe_lab import AlignedRouting, GemmConfig, grouped_matmul
        co.patch_moe_lab()
        def meta(*shape, dtype=torch.int32):
            return torch.empty(shape, dtype=dtype, device="meta")
        E, N, K, ROWS, FP8 = 8, 256, 512, 1024, torch.float8_e4m3fn
        out = {}
        for bm, tail in ((16, True), (64, False), (64, True)):
            routing = AlignedRouting(meta(E), meta(ROWS), meta(ROWS // bm), meta(1), bm, 256, 2, E)
            session = co.Session(compile_missing=True)
            with co.fake_gpu(90, session):
                grouped_matmul(meta(ROWS, K, dtype=FP8), meta(E, N, K, dtype=FP8), routing,
                               GemmConfig(bm, 128, 128, 1, 4, 3, tail_tiles=tail), gather_a=False,
                               a_scale=meta(ROWS, K // 128, dtype=torch.float32),
                               w_scale=meta(E, N // 128, K // 128, dtype=torch.float32), block_shape=(128, 128))
            (kernel,) = [k for k in session.kernels.values() if k.name == "grouped_matmul_kernel"]
            ptx = kernel.asm["ptx"]
            out[f"{bm},{tail}"] = ["wgmma.mma_async" in ptx, "mma.sync" in ptx]
        print("RESULT", json.dumps(out))
    """)
    assert run_child(code) == {"16,True": [False, True], "64,False": [True, False], "64,True": [True, True]}


def test_gluon_fp8_gemm_is_warp_specialized_on_sm90():
    """The Gluon FP8 grouped GEMM (moe_lab.gluon_fp8) compiles for sm_90 under this Triton, where its Gluon has
    warp_specialize: registers handed between partitions (setmaxnreg), TMA copies and wgmma in its PTX; so do
    its SwiGLU variants (silu, swigluoai) with the float8 output, whose PTX converts to e4m3. Where
    the Triton has no such Gluon, the launcher refuses with the reason instead."""
    code = textwrap.dedent("""
        import json, torch
        from moe_lab.tools import compile_only as co
        from moe_lab import AlignedRouting, capability
        from moe_lab.gluon_fp8 import grouped_matmul_fp8_gluon
        co.patch_moe_lab()
        def meta(*shape, dtype=torch.int32):
            return torch.empty(shape, dtype=dtype, device="meta")
        E, N, K, ROWS, BM, FP8, F32 = 8, 256, 512, 1024, 64, torch.float8_e4m3fn, torch.float32
        routing = AlignedRouting(meta(E), meta(ROWS), meta(ROWS // BM), meta(1), BM, 256, 2, E)
        session = co.Session(compile_missing=True)
        out = {"gluon": capability._gluon_problem()}
        with co.fake_gpu(90, session):
            try:
                grouped_matmul_fp8_gluon(meta(ROWS, K, dtype=FP8), meta(E, N, K, dtype=FP8), routing, gather_a=False,
                                         a_scale=meta(ROWS, K // 128, dtype=F32),
                                         w_scale=meta(E, N // 128, K // 128, dtype=F32))
                # The up projection with the SwiGLU epilogue (both kinds), float8 out with its scales.
                for kind in ("silu", "swigluoai"):
                    grouped_matmul_fp8_gluon(meta(256, K, dtype=FP8), meta(E, N, K, dtype=FP8), routing, gather_a=True,
                                             a_scale=meta(256, K // 128, dtype=F32),
                                             w_scale=meta(E, N // 128, K // 128, dtype=F32), activation=kind,
                                             out_scale=meta(ROWS, N // 256, dtype=F32))
            except RuntimeError as exc:
                out["refused"] = str(exc)
        if out["gluon"] is None:
            kernels = [k for k in session.kernels.values() if k.name == "fp8_grouped_matmul_ws_kernel"]
            out["variants"] = len(kernels)
            out["ptx"] = [[w in k.asm["ptx"] for w in ("setmaxnreg", "cp.async.bulk.tensor", "wgmma.mma_async",
                                                       "cvt.rn.satfinite.e4m3x2.f32")] for k in kernels]
        print("RESULT", json.dumps(out))
    """)
    result = run_child(code)
    if result["gluon"] is not None:
        assert result["gluon"] in result["refused"]
    else:
        assert "refused" not in result and result["variants"] == 3
        # every variant warp-specialized with TMA and wgmma; the SwiGLU ones also convert to float8 e4m3
        assert [ptx[:3] for ptx in result["ptx"]] == [[True, True, True]] * 3
        assert sorted(ptx[3] for ptx in result["ptx"]) == [False, True, True]


DESCRIPTOR_CHILD = textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, ".ci")
    import notebook_kernels as nbk
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.zeros(16, 32)
    plain = nbk.encode(TensorDescriptor.from_tensor(x, [8, 8]))
    nan = nbk.encode(TensorDescriptor.from_tensor(x, [8, 8], padding="nan"))
    back = nbk.decode(nan)
    print("RESULT", json.dumps({"plain": sorted(plain["descriptor"]), "nan": sorted(nan["descriptor"]),
                                "back": [list(back.block_shape), back.padding]}))
""")


def test_a_recorded_descriptor_leaves_out_fields_at_their_default():
    """So one recording replays under every Triton (3.6's TensorDescriptor has no round_f32_to_tf32)."""
    out = run_child(DESCRIPTOR_CHILD)
    assert out["plain"] == ["base", "block_shape", "shape", "strides"]
    assert out["nan"] == ["base", "block_shape", "padding", "shape", "strides"]
    assert out["back"] == [[8, 8], "nan"]


def test_the_fake_gpu_gives_back_tritons_driver():
    """After `fake_gpu`, Triton's driver is the one before (a later launch used to meet the fake driver)."""
    child = textwrap.dedent(
        """
        import triton
        from moe_lab.tools import compile_only as co

        before = triton.runtime.driver._active
        with co.fake_gpu(90, co.Session()):
            assert triton.runtime.driver.active is co.DRIVER
        assert triton.runtime.driver._active is before, triton.runtime.driver._active
        print("ok")
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
