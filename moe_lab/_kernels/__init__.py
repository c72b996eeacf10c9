"""`@triton.jit` bodies only: the ground floor. Launchers live one level up (`moe_lab.align`,
`moe_lab.gemm`, `moe_lab.activation`, `moe_lab.quantize`); nothing here checks inputs or picks
configs."""
