#!/usr/bin/env bash
# Prepared for the next session, not run: device run 4, after next.sh and next2.sh on the
# same machine (the kernels built; .whl/part-2 carried; next.sh's CUDA test of the fused add
# and RMSNorm passed). Each residual add and the RMSNorm after it in one kernel
# (`engine/_fused_norm.py`, off by default: 64 fewer kernels a 32-layer step, within and
# across blocks) against the default, in-process, in alternating pairs: 32 clients, then a
# lone greedy stream. The default changes only on both pairs of a load.
set -u
source bench/device/prepare.sh
source docs/results/2026-11-30-gpu24/lib.sh
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
C="$A --clients 32 --output-len 64:192 --duration 20"
O="$A --clients 1 --output-len 128 --temperature 0 --duration 15"
sa c32-fused 75 $C --fused-norms
sa c32-plain 75 $C
sa c32-plain-b 75 $C
sa c32-fused-b 75 $C --fused-norms
fits 60 && sa one-fused 60 $O --fused-norms
fits 60 && sa one-plain 60 $O
fits 60 && sa one-plain-b 60 $O
fits 60 && sa one-fused-b 60 $O --fused-norms
pack json.tgz c32-fused c32-plain c32-plain-b c32-fused-b one-fused one-plain one-plain-b \
  one-fused-b
cat $S
