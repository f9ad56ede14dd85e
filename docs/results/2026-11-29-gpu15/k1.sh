#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged in /tmp/stage, part 2 carried), issue 32:
# MLX's CUDA backend lets a thread keep ten command buffers in flight and then waits inside
# `async_eval` for the oldest to finish; a buffer holds MLX_MAX_OPS_PER_BUFFER kernels (30 on
# an H100/H200), so the host can run only ~300 kernels (about half a decode step) ahead of the
# device. The engine in-process (bench/step_anatomy.py --launch), 32 clients and one greedy
# client, with MLX's own limit against 150 a buffer. Llama-3.1-8B shapes, bf16.
set -u
source bench/device/prepare.sh
source docs/results/2026-11-29-gpu15/common.sh
echo "installed: $(elapsed)" >> $S
model_8b >> $S
anat warm "" 32 12
anat a32 "" 32 30
anat b32 150 32 30
anat a1 "" 1 20
anat b1 150 1 20
cat $S
