#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried), issue 32: the batch's KV
# written in place (engine/_kv_append.py). First the kernel's check against MLX's slice
# update and a bare pipelined loop of 32 layers (bench/kv_append.py), then the engine
# in-process under 32 closed-loop clients (bench/step_anatomy.py --launch), in place against
# MLX's updates (--kv-writes copy), alternating after a run that builds the kernels.
# Llama-3.1-8B, bf16. a-summary.txt first, the JSON archived.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
mkdir -p /tmp/j
timeout 150 python3 -P bench/kv_append.py --check --rows 32 --context 500:1000 --out /tmp/j/kv-append.json > /tmp/j/kv-append.log 2>&1
echo "== kv_append: rc=$? $(elapsed)" >> $S; tail -8 /tmp/j/kv-append.log >> $S
L="--model /tmp/l8b --clients 32 --input-len 500:1000 --output-len 64:192 --mode host --launch"
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
sa warm 240 $L --duration 8
[ $(( $(date +%s) - PREPARE_T0 )) -lt 470 ] && sa inplace 75 $L --duration 25
[ $(( $(date +%s) - PREPARE_T0 )) -lt 500 ] && sa copy 75 $L --duration 25 --kv-writes copy
[ $(( $(date +%s) - PREPARE_T0 )) -lt 520 ] && sa inplace2 75 $L --duration 25
cd /tmp/j && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
