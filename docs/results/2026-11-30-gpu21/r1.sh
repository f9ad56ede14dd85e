#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged; part 2 and .whl/test carried). The decode
# prelude (decisions/0058) and a lone sequence's in-place KV writes, at this tree: first the
# CUDA tests that compare the kernel with mlx-lm's path (pytest from the staged wheels),
# then the engine's bare decode step with and without the prelude against mlx-lm's
# (bench/batch_step.py --kernels: kernels a step by family, the device's busy time), then a
# lone greedy stream in-process with and without it (step_anatomy, the fast path), after a
# first short process that builds the 8B model's kernels.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/pt .whl/test/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/pt:$PYTHONPATH timeout 240 python3 -m pytest -q -p no:cacheprovider --noconftest \
  -o addopts="-ra" tests/engine/test_decode_prelude.py tests/engine/test_kv_append.py \
  tests/engine/test_ragged_cache.py -k "not fresh_cache" > $OUT/cuda-tests.log 2>&1
echo "== cuda tests: rc=$? $(elapsed)" >> $S
tail -12 $OUT/cuda-tests.log >> $S
model_8b >> $S
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
sa build 200 $A --clients 32 --output-len 64:192 --duration 8
grep -h "prelude\|attention routed" /tmp/j/build.log | head -3 >> $S
timeout 200 python3 -P bench/batch_step.py --model /tmp/l8b --rows 32 --context 500:1000 --kernels \
  --variants ours ours-no-prelude mlx_lm --out /tmp/j/batch-step.json > /tmp/j/batch-step.log 2>&1
echo "== batch step: rc=$? $(elapsed)" >> $S
python3 - /tmp/j/batch-step.json >> $S 2>&1 <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    k = r.get("kernels", {})
    print(r["variant"], {x: r[x] for x in ("wall_ms_per_step", "launch_ms_per_step", "python_ms_per_step", "tok_per_s")},
          "kernels", k.get("kernels_per_step"), "busy", k.get("busy_ms_per_step"))
    for f in k.get("by_family", [])[:12]:
        print("   ", f)
PY
sa one-prelude 80 $A --clients 1 --output-len 128 --temperature 0 --duration 15
sa one-no-prelude 80 $A --clients 1 --output-len 128 --temperature 0 --duration 15 --no-prelude
[ $(( $(date +%s) - PREPARE_T0 )) -lt 500 ] && sa one-prelude-again 80 $A --clients 1 --output-len 128 --temperature 0 --duration 15
cd /tmp/j && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
