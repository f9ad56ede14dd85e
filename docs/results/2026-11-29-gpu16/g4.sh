#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 and base-src.tar carried), issue 32,
# g2 again with MLX's CUDA graphs off as the engine has them (g2's probe initialized MLX
# before the engine set them off), the buffer-cache bound on the text engine's start. The
# engine in-process under 32 closed-loop clients (bench/step_anatomy.py through
# pool.py, MLX's cache and CUDA's pool sampled), this tree (KV buffers in whole steps, MLX's
# buffer cache bounded on CUDA) against the tree before (f085986) alternating, after a run
# that builds the kernels. Llama-3.1-8B, bf16.
# At most 8 files come back: a-summary.txt first, the rest in few files.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
mkdir -p /tmp/base && tar -xf docs/results/2026-11-29-gpu16/base-src.tar -C /tmp/base
D=docs/results/2026-11-29-gpu16
L="--model /tmp/l8b --clients 32 --input-len 500:1000 --output-len 64:192 --mode host --launch"
mkdir -p /tmp/j
report() {
  python3 - /tmp/j/$1.json /tmp/j/$1-pool.json >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
h = d["host"]
print(" ", {k: h.get(k) for k in ("requests", "tokens", "tok_per_s", "steps", "ms_per_step", "ttft_ms_p50")})
for k, v in list(h["phases"].items())[:8]:
    print(f"    {k:18s} {v['ms_per_step']:7.2f} ms/step  calls {v['calls']}")
p = json.load(open(sys.argv[2]))
s = p["samples"]
print("   cache/pool GB (t, cache, reserved):", [(x["t"], round(x["cache_gb"], 1), round(x["pool_reserved_gb"], 1)) for x in s[::3]])
PY
}
sa() {  # sa NAME SRC LIMIT ARGS...
  local name=$1 src=$2 t=$3; shift 3
  PYTHONPATH=$src PROBE_OUT=/tmp/j/$name-pool.json timeout $t python3 -P $D/pool.py "$@" --out /tmp/j/$name.json > /tmp/j/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  report $name
}
sa warm $PWD/src 240 $L --duration 10
sa new1 $PWD/src 120 $L --duration 30
sa base1 /tmp/base/src 120 $L --duration 30
sa new2 $PWD/src 120 $L --duration 30
cd /tmp/j && tar -czf $OUT/json.tgz *.json && cd - > /dev/null
cat $S
