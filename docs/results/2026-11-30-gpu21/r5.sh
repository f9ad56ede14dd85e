#!/usr/bin/env bash
# Device run 4, right after r4 on the same machine (run as one command line; kept here as
# it ran). r3's comparison ran under torch.profiler (--kernels), which slowed every step
# about twofold on this machine; the same choices without it, in-process (step_anatomy
# --mode host --launch), in this order: 32 clients with the split attention at 1,024 target
# blocks, at the tree's 128, at 1,024 without the decode prelude; one greedy client with
# and without the prelude; 1,024 again.
set -u; source bench/device/prepare.sh; S=$OUT/a-summary.txt; source docs/results/2026-11-29-gpu19/lib.sh
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
C="$A --clients 32 --output-len 64:192 --duration 20"
O="$A --clients 1 --output-len 128 --temperature 0 --duration 15"
sa c32-b1024 80 $C --attention-blocks 1024
sa c32-b128 80 $C
sa c32-b1024-noprelude 80 $C --attention-blocks 1024 --no-prelude
sa one-prelude 60 $O
sa one-no-prelude 60 $O --no-prelude
[ $(( $(date +%s) - PREPARE_T0 )) -lt 330 ] && sa c32-b1024-again 80 $C --attention-blocks 1024
cd /tmp/j && tar -czf $OUT/json.tgz c32-b*.json one-*prelude.json && cd - >/dev/null; cat $S
