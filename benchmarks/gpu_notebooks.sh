#!/usr/bin/env bash
# Execute every notebook top to bottom on a GPU at full size (their py:percent twins, under IPython), then the
# multi-GPU expert-parallel test. Logs go to $OUT (or ./gpu-out). Usage: bash benchmarks/gpu_notebooks.sh
# (NOTEBOOKS="notebooks/08_persistent_and_fused.py ..." runs only those; SKIP_EP=1 skips the expert-parallel test)
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$OUT/gpus.txt"
for nb in ${NOTEBOOKS:-notebooks/0*.py}; do
  name=$(basename "$nb" .py)
  start=$(date +%s)
  (cd notebooks && timeout 300 python3 -m IPython --colors=nocolor "$name.py") > "$OUT/nb-$name.txt" 2>&1
  rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - start )) s; PASS lines: $(grep -c '^PASS' "$OUT/nb-$name.txt"), FAIL/Error lines: $(grep -cE '^FAIL|Error' "$OUT/nb-$name.txt")" | tee -a "$OUT/notebooks.txt"
done
[ -n "${SKIP_EP:-}" ] || python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu.py -k expert_parallel 2>&1 | tail -8 | tee "$OUT/expert-parallel.txt"
