#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried). First what the engine's
# own CUDA kernels cost a start (bench/custom_kernels.py, two fresh processes; g1's runs
# failed on an import). Then MLX's CUDA graphs again, served through bench/serving.py
# (decisions/0046 turned them off on 2026-11-28's engine, before the batch's KV lived in
# whole steps; g1's step anatomy shows the served step bound by the host's launches): a
# server start that builds the kernels, then a lone greedy client with graphs and without,
# then 32 closed-loop clients with graphs and without. Llama-3.1-8B, bf16.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
mkdir -p /tmp/g /tmp/j
for run in 1 2; do
  timeout 100 python3 -P bench/custom_kernels.py --out /tmp/g/custom-kernels-$run.json > /tmp/g/ck-$run.log 2>&1
  echo "== custom kernels $run: rc=$? $(elapsed)" >> $S; tail -6 /tmp/g/ck-$run.log >> $S
done
model_8b >> $S
T07="--mix temperature --temperature 0.7"
B="--model /tmp/l8b --server-concurrency 32 --input-len 500:1000 --ignore-eos --log-dir /tmp/g"
run() {  # run NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py "$@" --out /tmp/g/$name.json > /tmp/g/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  grep -E '^\| (ours|mlx_lm)|^GPU busy' /tmp/g/$name.log >> $S
}
ONE="--server ours $B --clients 1 --output-len 128 --mix greedy --duration 25 --warmup 2"
C32="--server ours $B --clients 32 --output-len 64:192 $T07 --duration 35 --warmup 8"
run built 200 --server ours $B --clients 1 --output-len 128 --mix greedy --duration 5 --warmup 2
run one-graphs 90 $ONE --ours-args=--cuda-graphs
run one 90 $ONE
[ $(( $(date +%s) - PREPARE_T0 )) -lt 420 ] && run c32-graphs 100 $C32 --ours-args=--cuda-graphs
[ $(( $(date +%s) - PREPARE_T0 )) -lt 490 ] && run c32 100 $C32
grep -hE "warm-up|ready" /tmp/g/*ours*.log 2>/dev/null | head -30 > $OUT/ours-startups.txt
cd /tmp/g && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
