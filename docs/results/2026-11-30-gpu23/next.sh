#!/usr/bin/env bash
# Prepared for the next session, not run: device run 2 of a fresh machine (part 1 staged;
# .whl/part-2 carried). The engine as it ships since decisions/0060 (the decode attention
# compiled by MLX, one kernel at 32 rows) in-process under 32 clients, the first run building
# the kernels; then the decode prelude in the running batch's step too (--prelude-batches: 96
# fewer kernels a step to launch for a longer kernel, never compared in pairs at the same
# target blocks while the step is bound by the host), alternating; prefill chunks of up to
# 1,024 tokens against 512 (a chunk's launch costs the host about as much whatever its
# length, and a ~750-token prompt takes two chunks of 512); then a lone greedy
# stream (next2.sh, the call after: one call's limit holds this half); c3.sh (the call
# after that, same machine) serves it
# against mlx_lm.server for issue 32's served table, which this session measured only with
# the split form it then turned down.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
model_8b >> $S
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
sa c32-build 200 $A --clients 32 --output-len 64:192 --duration 20
C="$A --clients 32 --output-len 64:192 --duration 20"
sa c32 75 $C
sa c32-prelude 75 $C --prelude-batches
cd /tmp/j && tar -czf $OUT/json.tgz *.json && cd - > /dev/null
cat $S
