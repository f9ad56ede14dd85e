#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried). k3.sh found the in-place
# writes racing under MLX's CUDA graphs, which bench/kv_append.py left on (it never started
# an engine; MLX reads the switch at its first kernel); the engine package now sets the
# engine's default (graphs off) as it is imported. Again: the check and the bare pipelined
# loop, then the engine in-process under 32 closed-loop clients, in place (its first run
# builds the kernels), MLX's updates (--kv-writes copy), in place again. Llama-3.1-8B, bf16.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
mkdir -p /tmp/j
timeout 120 python3 -P bench/kv_append.py --check --rows 32 --context 500:1000 --rounds 2 --out /tmp/j/kv-append.json > /tmp/j/kv-append.log 2>&1
echo "== kv_append: rc=$? $(elapsed)" >> $S
python3 - /tmp/j/kv-append.json >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("  check all ok:", d["check"]["all_ok"], [c for c in d["check"]["cases"] if not c["ok"]])
for r in d["runs"]:
    print(" ", r)
PY
model_8b >> $S
L="--model /tmp/l8b --clients 32 --input-len 500:1000 --output-len 64:192 --mode host --launch"
report() {
  python3 - /tmp/j/$1.json >> $S 2>&1 <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["host"]
print(" ", {k: h.get(k) for k in ("requests", "tok_per_s", "ms_per_step", "ttft_ms_p50")})
for k, v in list(h["phases"].items())[:7]:
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
sa inplace 200 $L --duration 20
[ $(( $(date +%s) - PREPARE_T0 )) -lt 420 ] && sa copy 110 $L --duration 25 --kv-writes copy
[ $(( $(date +%s) - PREPARE_T0 )) -lt 450 ] && sa inplace2 110 $L --duration 25
cd /tmp/j && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
