#!/usr/bin/env bash
# Prepared for the next session, not run: device run 2 of a fresh machine (part 1 staged,
# part 2 carried), issue 32's served targets in one bench/serving.py run per load, which now
# samples the GPU's busy share over each load's own window: 32 closed-loop clients, ours and
# mlx_lm.server, after an untimed short run of ours whose first start builds the kernels;
# then, time left, Poisson arrivals at 4/s and one greedy client on ours. Llama-3.1-8B,
# bf16. a-summary.txt first, the JSON archived.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
mkdir -p /tmp/g
T07="--mix temperature --temperature 0.7"
B="--model /tmp/l8b --server-concurrency 32 --input-len 500:1000 --ignore-eos"
run() {  # run NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py "$@" --out /tmp/g/$name.json > /tmp/g/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  grep -E '^\| (ours|mlx_lm|ours/)|^GPU busy' /tmp/g/$name.log >> $S
}
run build 330 --server ours $B --clients 8 --output-len 16 --duration 5 --warmup 2
run c32 330 --server ours --server mlx_lm $B --clients 32 --output-len 64:192 $T07 --duration 40 --warmup 8
[ $(( $(date +%s) - PREPARE_T0 )) -lt 430 ] && run poisson 110 --server ours $B --rate 4 --output-len 64:192 $T07 --duration 40 --warmup 8
[ $(( $(date +%s) - PREPARE_T0 )) -lt 510 ] && run one 80 --server ours $B --clients 1 --output-len 128 --mix greedy --duration 25 --warmup 1
cd /tmp/g && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
