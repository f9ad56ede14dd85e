#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged; .whl/part-2 and .whl/test carried): the
# engine as it ships since decisions/0060 (the decode attention compiled by MLX) in-process
# under 32 clients, the first run building the kernels; the ragged attention's CUDA test,
# whose one-kernel case MLX now compiles; then prefill chunks of up to 1,024 tokens against
# 512 (a chunk's launch costs the host about the same whatever its length, and a ~750-token
# prompt takes two chunks of 512), in an ordered pair that d3.sh repeats reversed.
set -u
source bench/device/prepare.sh
source docs/results/2026-11-30-gpu24/lib.sh
model_8b >> $S
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
C="$A --clients 32 --output-len 64:192 --duration 20"
sa c32-build 200 $C
cuda_tests tests/engine/test_ragged_cache.py -k kernel_equals
fits 80 && sa c32-chunk1024 80 $C --prefill-step-size 1024
fits 75 && sa c32 75 $C
pack json.tgz c32-build c32-chunk1024 c32
cat $S
