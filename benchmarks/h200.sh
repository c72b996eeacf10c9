#!/usr/bin/env bash
# One H200 session: GPU tests, the demo at full size, and the benchmark, logged under $OUT (or ./h200-out).
# Usage (repository root, on the GPU machine): bash benchmarks/h200.sh [bench args...]
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -m moe_lab info | tee -a "$OUT/gpu.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/pytest-gpu.txt" | grep -E "rel err|passed|failed|Error|error" | tail -40
fi
if [ -z "${SKIP_DEMO:-}" ]; then
  python3 -m moe_lab demo 2>&1 | tee "$OUT/demo.txt"
fi
python3 -m moe_lab bench --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.txt"
