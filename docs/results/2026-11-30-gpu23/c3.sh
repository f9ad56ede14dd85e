#!/usr/bin/env bash
# Device run 3, right after c2.sh on the same machine (the kernels built): issue 32's served
# table, ours against mlx_lm.server in one bench/serving.py run (32 closed-loop clients,
# 500-1,000 in, 64-192 out, temperature 0.7, GPU busy over each load's window), then one
# greedy client of ours.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
mkdir -p /tmp/j
T07="--mix temperature --temperature 0.7"
B="--model /tmp/l8b --server-concurrency 32 --input-len 500:1000 --ignore-eos"
run() {  # run NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py "$@" --out /tmp/j/$name.json > /tmp/j/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  grep -E '^\| (ours|mlx_lm|ours/)|^GPU busy|ready' /tmp/j/$name.log >> $S
}
run c32 290 --server ours --server mlx_lm $B --clients 32 --output-len 64:192 $T07 \
  --duration 30 --warmup 8
[ $(( $(date +%s) - PREPARE_T0 )) -lt 330 ] && run one 80 --server ours $B --clients 1 \
  --output-len 128 --mix greedy --duration 20 --warmup 1
cd /tmp/j && tar -czf $OUT/json.tgz c32.json c32.log one.json one.log 2>/dev/null; cd - > /dev/null
cat $S
