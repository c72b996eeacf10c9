"""Experiment: is the FP8 layer batch invariant on an H200, and with which tiles? One token's output row,
alone (T=1) and at a fixed position of batches of 40 and 4096 (Qwen3-30B-A3B, block-scaled [128, 128]):
with the tuned configs (tiles change with T), and with one config forced at every T: 64-row tiles without
tail tiles (wgmma only), and 16-row tiles (mma.sync only). Usage: python benchmarks/experiments/fp8_batch_invariance.py
"""
import torch

from moe_lab import GemmConfig, MoEConfig, fused_moe, get_preset, quantize_weights_fp8, topk_routing


def rows(p, configs, sizes=(1, 40, 4096)):
    gen = torch.Generator(device="cpu").manual_seed(7)
    e, h, i = p.num_experts, p.hidden_size, p.intermediate_size
    w1 = (torch.randn(e, 2 * i, h, generator=gen) / h ** 0.5).cuda().bfloat16()
    w2 = (torch.randn(e, h, i, generator=gen) / i ** 0.5).cuda().bfloat16()
    (w1, s1), (w2, s2) = quantize_weights_fp8(w1, (128, 128)), quantize_weights_fp8(w2, (128, 128))
    token = torch.randn(1, h, generator=gen).cuda().bfloat16()
    token_logits = torch.randn(1, e, generator=gen).cuda()
    batches = []
    for size in sizes:
        hs = torch.randn(size, h, generator=gen).cuda().bfloat16()
        logits = torch.randn(size, e, generator=gen).cuda()
        hs[size // 2], logits[size // 2] = token[0], token_logits[0]
        batches.append((hs, topk_routing(logits, top_k=p.top_k), size // 2))
    for name, cfg in configs.items():
        outs = [fused_moe(hs, w1, w2, tw, ti, config=cfg, w1_scale=s1, w2_scale=s2, block_shape=(128, 128))[where]
                for hs, (tw, ti), where in batches]
        diffs = [float((o.float() - outs[0].float()).abs().max()) for o in outs[1:]]
        print(f"{p.name:<15} {name:<28} max |row - alone| at T={sizes[1:]}: {diffs}", flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__)
    for model in ("qwen3-30b-a3b", "mixtral-8x7b"):
        rows(get_preset(model), {
            "tuned (tiles change with T)": None,
            "64x128, no tail tiles": MoEConfig(GemmConfig(64, 128, 128, 8, 4, 3, tail_tiles=False),
                                               GemmConfig(64, 128, 128, 8, 4, 3, tail_tiles=False)),
            "64x128, tail tiles": MoEConfig(GemmConfig(64, 128, 128, 8, 4, 3), GemmConfig(64, 128, 128, 8, 4, 3)),
            "16x64": MoEConfig(GemmConfig(16, 64, 128, 1, 4, 4), GemmConfig(16, 64, 128, 1, 4, 4)),
        })
