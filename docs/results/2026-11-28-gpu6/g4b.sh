#!/usr/bin/env bash
# Device run (one GPU, after g4a.sh), issues 34 and 32: Llama-3.1-8B shapes bf16, one greedy
# stream, 5 interleaved rounds of the chat: off; the random 1B draft model, adaptive (never
# accepted: what speculation costs where it cannot pay); and mlx-lm's own stream_generate on
# the same prompts and weights (a lone stream in-process, ours against mlx-lm's loop).
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout 560 python3 -P bench/speculative.py --model /tmp/l8b --draft-model /tmp/l1b --kv-cache-bytes 8000000000 --rounds 5 --tokens 128 --workloads chat --variants off "draft (adaptive, 4)" mlx-lm --trace-costs --out $OUT/zero-accept.json > $OUT/zero-accept.log 2>&1; echo "zero accept: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "x[0-9]\.[0-9]{2}|plain reads|tok/s$" $OUT/zero-accept.log | tail -24
