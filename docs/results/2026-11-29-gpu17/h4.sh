#!/usr/bin/env bash
# Ran 2026-11-29 19:45-19:53 UTC (the next session): docs/results/2026-11-29-gpu18/call-2/.
# Prepared for the next session, not run (this session's device time was spent): device run
# 2 of a fresh machine (part 1 staged, part 2 carried), issue 32. The served step's misses
# in MLX's buffer cache: h3's profile has cudaMallocAsync at 9% of the engine thread while
# the cache sat at its bound (a tenth of the device, call-2's memory samples 13-15 GB), where
# MLX releases a freed buffer instead of keeping it. The engine in-process under 32
# closed-loop clients (bench/step_anatomy.py --launch, memory sampled), the cache bounded at
# the engine's tenth (14.4 GB on an H200), a quarter (36) and two fifths (57), alternating
# after a run that builds the kernels. Llama-3.1-8B, bf16. a-summary.txt first.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
L="--model /tmp/l8b --clients 32 --input-len 500:1000 --output-len 64:192 --mode host --launch"
mkdir -p /tmp/j
report() {
  python3 - /tmp/j/$1.json >> $S 2>&1 <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["host"]
print(" ", {k: h.get(k) for k in ("requests", "tok_per_s", "ms_per_step", "ttft_ms_p50")})
for k, v in list(h["phases"].items())[:6]:
    print(f"    {k:18s} {v['ms_per_step']:7.2f} ms/step  calls {v['calls']}")
m = h["memory"]["samples"]
print("   cache GB:", [round(x["cache_gb"], 1) for x in m[::3]], "pool GB:", [round(x.get("pool_reserved_gb", 0), 1) for x in m[::3]])
PY
}
sa() {  # sa NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/step_anatomy.py "$@" --out /tmp/j/$name.json > /tmp/j/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  report $name
}
sa warm 240 $L --duration 10
sa c14 110 $L --duration 30 --cache-limit-gb 13.4
sa c36 110 $L --duration 30 --cache-limit-gb 33.5
sa c57 110 $L --duration 30 --cache-limit-gb 53.5
sa c14b 110 $L --duration 30 --cache-limit-gb 13.4
cd /tmp/j && tar -czf $OUT/json.tgz *.json && cd - > /dev/null
cat $S
