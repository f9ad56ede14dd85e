#!/usr/bin/env bash
# Device run (one GPU), issues 34 and 32, part a: the 8B-shaped target and the 1B-shaped draft
# (random weights, the same tokenizer: the draft is never accepted), then one short pass of
# g4b.sh's variants so that the kernels they run are built and on disk before g4b times them.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
[ -d /tmp/l1b ] || python3 -m mlx_nursery make-model /tmp/l1b --preset llama-3.2-1b --dtype bfloat16 > $OUT/make-1b.log 2>&1; echo "1b: $(( $(date +%s) - t0 )) s"
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make-8b.log 2>&1; echo "8b: $(( $(date +%s) - t0 )) s"
timeout 420 python3 -P bench/speculative.py --model /tmp/l8b --draft-model /tmp/l1b --kv-cache-bytes 8000000000 --rounds 1 --tokens 32 --workloads chat --variants off "draft (adaptive, 4)" mlx-lm --out $OUT/pre.json > $OUT/pre.log 2>&1; echo "pre: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "x[0-9]\.[0-9]{2}" $OUT/pre.log
