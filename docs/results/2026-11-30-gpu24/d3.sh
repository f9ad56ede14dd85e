#!/usr/bin/env bash
# Device run 3, right after d2.sh on the same machine (the kernels built; .whl/part-2
# carried): the chunk pair again, reversed; a lone greedy stream in-process; then issue 32's
# served table at the shipped default, ours against mlx_lm.server in one bench/serving.py
# run (32 closed-loop clients, 500-1,000 in, 64-192 out, temperature 0.7, GPU busy over each
# load's window).
set -u
source bench/device/prepare.sh
source docs/results/2026-11-30-gpu24/lib.sh
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
C="$A --clients 32 --output-len 64:192 --duration 20"
sa c32-again 75 $C
sa c32-chunk1024-again 80 $C --prefill-step-size 1024
sa one 60 $A --clients 1 --output-len 128 --temperature 0 --duration 15
B="--model /tmp/l8b --server-concurrency 32 --input-len 500:1000 --ignore-eos"
fits 290 && served s32 290 --server ours --server mlx_lm $B --clients 32 --output-len 64:192 \
  --mix temperature --temperature 0.7 --duration 30 --warmup 8
pack json.tgz c32-again c32-chunk1024-again one s32
cat $S
