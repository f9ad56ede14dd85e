#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried): MLX's CUDA graphs again
# (decisions/0046 turned them off on 2026-11-28's engine, before the batch's KV lived in whole
# steps; a lone stream was faster with them since), served through bench/serving.py: a
# lone greedy client with graphs and without, then 32 closed-loop clients, ours without
# graphs against mlx_lm.server, then ours with graphs. Each server start of ours after the
# first finds MLX's kernels on disk. Llama-3.1-8B, bf16.
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
ONE="--server ours $B --clients 1 --output-len 128 --mix greedy --duration 25 --warmup 2"
run one-built 200 $ONE
run one-graphs 100 $ONE --ours-args=--cuda-graphs
run one 100 $ONE
C32="$B --clients 32 --output-len 64:192 $T07 --duration 40 --warmup 8"
[ $(( $(date +%s) - PREPARE_T0 )) -lt 300 ] && run c32 200 --server ours --server mlx_lm $C32
[ $(( $(date +%s) - PREPARE_T0 )) -lt 480 ] && run c32-graphs 110 --server ours $C32 --ours-args=--cuda-graphs
grep -hE "warm-up|ready" /tmp/g/*ours*.log 2>/dev/null | head -30 > $OUT/ours-startups.txt
cd /tmp/g && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
