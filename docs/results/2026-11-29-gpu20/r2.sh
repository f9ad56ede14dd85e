#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried). First, where the device
# sits idle under the 32-client load and what the engine thread does meanwhile
# (step_anatomy --kernels: CUPTI's kernels over 3 s laid against the engine thread's
# phases); then issue 32's served table at this tree, ours against mlx_lm.server in one
# bench/serving.py run (32 closed-loop clients, 500-1,000 in, 64-192 out, temperature 0.7,
# GPU busy over each load's window); then, time left, one greedy client.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
mkdir -p /tmp/g
timeout 280 python3 -P bench/step_anatomy.py --model /tmp/l8b --clients 32 --input-len 500:1000 \
  --output-len 64:192 --mode host --launch --kernels --duration 30 --out /tmp/g/anatomy.json > /tmp/g/anatomy.log 2>&1
echo "== anatomy: rc=$? $(elapsed)" >> $S
python3 - /tmp/g/anatomy.json >> $S 2>&1 <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["host"]
print({k: h.get(k) for k in ("requests", "tok_per_s", "ms_per_step")})
for k, v in list(h["phases"].items())[:10]:
    print(f"  {k:18s} {v['ms_per_step']:7.2f} ms/step")
k = h["kernels"]
print({x: k.get(x) for x in ("window_s", "busy_share", "kernels", "decode_steps", "error")})
print("idle ms by phase:", k.get("idle_ms_by_phase"))
PY
T07="--mix temperature --temperature 0.7"
B="--model /tmp/l8b --server-concurrency 32 --input-len 500:1000 --ignore-eos"
run() {  # run NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py "$@" --out /tmp/g/$name.json > /tmp/g/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  grep -E '^\| (ours|mlx_lm|ours/)|^GPU busy' /tmp/g/$name.log >> $S
}
run c32 300 --server ours --server mlx_lm $B --clients 32 --output-len 64:192 $T07 --duration 40 --warmup 8
[ $(( $(date +%s) - PREPARE_T0 )) -lt 500 ] && run one 80 --server ours $B --clients 1 --output-len 128 --mix greedy --duration 25 --warmup 1
cd /tmp/g && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
