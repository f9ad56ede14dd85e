#!/usr/bin/env bash
# Not run: the session's device time went to k3/k4 after k1's check failed (k-call-2/).
# Device run 3, on the machine that ran k1.sh (part 2 carried; MLX's own kernels on its disk,
# the model made), issue 32's served targets with the batch's KV written in place: one
# bench/serving.py run per load, which samples the GPU's busy share over each load's window:
# 32 closed-loop clients, ours and mlx_lm.server in one run; then, time left, one greedy
# client and Poisson arrivals at 4/s on ours. Llama-3.1-8B, bf16. a-summary.txt first.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
mkdir -p /tmp/g
T07="--mix temperature --temperature 0.7"
B="--model /tmp/l8b --server-concurrency 32 --input-len 500:1000 --ignore-eos --log-dir /tmp/g"
run() {  # run NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py "$@" --out /tmp/g/$name.json > /tmp/g/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  grep -E '^\| (ours|mlx_lm)|^GPU busy' /tmp/g/$name.log >> $S
}
run c32 330 --server ours --server mlx_lm $B --clients 32 --output-len 64:192 $T07 --duration 40 --warmup 8
[ $(( $(date +%s) - PREPARE_T0 )) -lt 420 ] && run one 90 --server ours $B --clients 1 --output-len 128 --mix greedy --duration 25 --warmup 1
[ $(( $(date +%s) - PREPARE_T0 )) -lt 480 ] && run poisson 110 --server ours $B --rate 4 --output-len 64:192 $T07 --duration 40 --warmup 8
grep -hE "warm-up|ready" /tmp/g/*ours*.log 2>/dev/null | head -30 > $OUT/ours-startups.txt
cd /tmp/g && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
