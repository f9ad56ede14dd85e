#!/usr/bin/env bash
# Device run (one GPU; parts 1, 3 and 4 staged in /tmp/stage, part 2 carried).
# Issue 32: the engine's batched decode step alone against mlx-lm's (32 and 8 rows, 8B
# shapes), kernels a step by family, to find what a step launches beyond mlx-lm's.
# Issue 34: eight speculating streams with the control's cost trace, by round.
set -u
source bench/device/prepare.sh
model_8b
for rows in 32 8; do
  timeout 200 python3 -P bench/batch_step.py --model /tmp/l8b --rows $rows --context 500:1000 \
    --steps 32 --kernels --out $OUT/batch-step-$rows.json > $OUT/batch-step-$rows.log 2>&1
  echo "batch step $rows rows: rc=$? $(elapsed)"
  python3 - $OUT/batch-step-$rows.json <<'PY'
import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    k=r.get("kernels",{})
    print(r["variant"], {x: r[x] for x in r if x.endswith("per_step")}, r["tok_per_s"], "tok/s; kernels", k.get("kernels_per_step"), "busy", k.get("busy_ms_per_step"), "ms")
    for f in k.get("by_family", [])[:22]: print("   ", f)
PY
done
smollm2
left=$(( 560 - $(date +%s) + PREPARE_T0 ))
timeout $left python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 2 --streams 8 --tokens 128 \
  --variants off "ngram (adaptive, 4)" --trace-costs --out $OUT/spec8-trace.json > $OUT/spec8-trace.log 2>&1
echo "spec trace: rc=$? $(elapsed)"
grep -E "x[0-9]\.[0-9]{2}" $OUT/spec8-trace.log | tail -8
