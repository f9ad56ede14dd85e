#!/usr/bin/env bash
# Device run 3, right after r1 on the same machine: the engine in-process under 32 clients
# (500-1,000 in, 64-192 out, temperature 0.7) with MLX's CUDA graphs on and off, in the
# order on, off, on, off (20 s each), then a lone greedy stream again on and off.
set -u; source bench/device/prepare.sh; S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
C="$A --clients 32 --output-len 64:192 --duration 20"
O="$A --clients 1 --output-len 128 --temperature 0 --duration 15"
sa c32-on 85 $C --cuda-graphs
sa c32-off 85 $C
sa c32-on-2 85 $C --cuda-graphs
sa c32-off-2 85 $C
[ $(( $(date +%s) - PREPARE_T0 )) -lt 420 ] && sa one-on-2 80 $O --cuda-graphs
[ $(( $(date +%s) - PREPARE_T0 )) -lt 500 ] && sa one-off-2 80 $O
cd /tmp/j && tar -czf $OUT/json.tgz c32-*.json c32-*.log one-*-2.json && cd - > /dev/null
cat $S
