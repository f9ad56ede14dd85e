#!/usr/bin/env bash
# Device run (one GPU, part 1 staged), issue 32: does the engine thread wait for the GIL?
# It gives the GIL up in every MLX call that launches or waits, and takes it back while the
# HTTP side (Trio, Hypercorn) runs Python; Python's switch interval (5 ms) bounds that wait.
# 32 closed-loop clients through the server, Python's interval against 0.5 ms, after an
# untimed start that builds the kernels.
set -u
t0=$(date +%s)
source docs/results/2026-11-28-gpu7/common.sh
bash .whl/part-2/install-mlx-cuda.sh > /tmp/install.log 2>&1; echo "install rc=$? $(( $(date +%s) - t0 )) s"
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make-8b.log 2>&1
cat /tmp/l8b/*.safetensors > /dev/null; echo "model: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
served warm 32 15 500:1000 64:192 "$T07"; echo "warm: $(( $(date +%s) - t0 )) s"
served c32-py $LOAD32 "$T07"; echo "$(( $(date +%s) - t0 )) s"
served c32-05 $LOAD32 "$T07" --gil-switch-interval-ms 0.5; echo "$(( $(date +%s) - t0 )) s"
