#!/usr/bin/env bash
# The GPU runner, logged under $OUT (or ./h200-out). Usage (repository root, on the GPU machine):
#   bash benchmarks/h200.sh [bench args...]   GPU tests, the demo at full size, and the benchmark
#   bash benchmarks/h200.sh notebooks         every notebook top to bottom at full size (their py:percent
#                                             twins, under IPython), then the multi-GPU expert-parallel test
# SKIP_TESTS=1 / SKIP_DEMO=1 skip those steps of the first; for the second, NOTEBOOKS="notebooks/08_*.py ..."
# runs only those and SKIP_EP=1 skips the expert-parallel test.
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

if [ "${1:-}" = notebooks ]; then
  export MPLBACKEND=Agg
  nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$OUT/gpus.txt"
  for nb in ${NOTEBOOKS:-notebooks/0*.py}; do
    name=$(basename "$nb" .py)
    start=$(date +%s)
    (cd notebooks && timeout 300 python3 -m IPython --colors=nocolor "$name.py") > "$OUT/nb-$name.txt" 2>&1
    rc=$?
    echo "$name: exit $rc in $(( $(date +%s) - start )) s; PASS lines: $(grep -c '^PASS' "$OUT/nb-$name.txt"), FAIL/Error lines: $(grep -cE '^FAIL|Error' "$OUT/nb-$name.txt")" | tee -a "$OUT/notebooks.txt"
  done
  [ -n "${SKIP_EP:-}" ] || python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu.py -k expert_parallel 2>&1 | tail -8 | tee "$OUT/expert-parallel.txt"
  exit 0
fi

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -m moe_lab info | tee -a "$OUT/gpu.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/pytest-gpu.txt" | grep -E "rel err|passed|failed|Error|error" | tail -40
fi
if [ -z "${SKIP_DEMO:-}" ]; then
  python3 -m moe_lab demo 2>&1 | tee "$OUT/demo.txt"
fi
python3 -m moe_lab bench --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.txt"
