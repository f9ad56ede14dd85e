#!/usr/bin/env bash
# Device run (one GPU, part 1 staged in /tmp/stage, part 2 carried), issue 32: the served
# 32-client load at HEAD (the ragged cache's shared offsets, not yet measured on a GPU), and
# whether fewer, larger prefill chunks pay: a chunk's launch costs the host about as much at
# any size (benchmarks.md), and this load's prompts (500-1,000 tokens) take two 512-token
# chunks each.
set -u
t0=$(date +%s)
source docs/results/2026-11-28-gpu7/common.sh
python3 -c "import mlx.core" 2>/dev/null || bash .whl/part-2/install-mlx-cuda.sh > /tmp/install.log 2>&1
python3 -c "import mlx.core, trio" || { echo "not installed"; tail -5 /tmp/install.log; exit 2; }
echo "install: $(( $(date +%s) - t0 )) s"
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make-8b.log 2>&1
cat /tmp/l8b/*.safetensors > /dev/null; echo "model: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc; git log -1 --format=%h 2>/dev/null
served warm 32 15 500:1000 64:192 "$T07"; echo "warm: $(( $(date +%s) - t0 )) s"
served c32 $LOAD32 "$T07"; echo "$(( $(date +%s) - t0 )) s"
served c32-p1024 $LOAD32 "$T07" --prefill-step-size 1024; echo "$(( $(date +%s) - t0 )) s"
