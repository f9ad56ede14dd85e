#!/usr/bin/env bash
# Device run 4, right after r2 on the same machine: issue 32's served table, ours against
# mlx_lm.server in one bench/serving.py run (32 closed-loop clients, 500-1,000 in, 64-192
# out, temperature 0.7, GPU busy over each load's window), then one greedy client. Ours
# serves with --cuda-graphs where r2's 32-client runs with graphs on were the faster pair
# (the sum of the two runs each), and as the tree's default otherwise.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
G=$(python3 - <<'PY'
import json
rate = lambda n: json.load(open(f"/tmp/j/{n}.json"))["host"]["tok_per_s"]
on, off = rate("c32-on") + rate("c32-on-2"), rate("c32-off") + rate("c32-off-2")
print("--cuda-graphs" if on > off else "")
PY
)
echo "serving ours with: '$G'" >> $S
T07="--mix temperature --temperature 0.7"
B="--model /tmp/l8b --server-concurrency 32 --input-len 500:1000 --ignore-eos"
run() {  # run NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py "$@" --out /tmp/j/$name.json > /tmp/j/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  grep -E '^\| (ours|mlx_lm|ours/)|^GPU busy' /tmp/j/$name.log >> $S
}
run c32 330 --server ours --server mlx_lm $B --clients 32 --output-len 64:192 $T07 \
  --duration 40 --warmup 8 --ours-args "$G"
[ $(( $(date +%s) - PREPARE_T0 )) -lt 470 ] && run one 90 --server ours $B --clients 1 \
  --output-len 128 --mix greedy --duration 25 --warmup 1 --ours-args "$G"
cd /tmp/j && tar -czf $OUT/json.tgz c32.json c32.log one.json one.log && cd - > /dev/null
cat $S
