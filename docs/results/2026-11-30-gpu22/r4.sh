#!/usr/bin/env bash
# Device run 2 of a second fresh machine (part 1 staged; .whl/part-2 carried). r1's bare
# step with graphs off made 343 CUDA allocations (cudaMallocAsync, and as many frees) a step
# where graphs on made none, and left the device idle a third of the step: batch_step now
# bounds MLX's buffer cache for ours as the engine does. Here: the bare step so (ours only,
# the first process: builds the kernels), then the engine in-process under 32 clients with
# the profiler (--kernels: the device's busy share, and now the host's CUDA calls a decode
# step: allocations, graphs built, updated, instantiated), graphs off then on.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
source docs/results/2026-11-30-gpu22/lib.sh
model_8b >> $S
bs off-bounded 170 0 --context 500:1000 --kernels --variants ours
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch --kernels"
C="$A --clients 32 --output-len 64:192 --duration 12"
k() {  # k NAME: the kernels section of step_anatomy's JSON
  python3 - /tmp/j/$1.json >> $S 2>&1 <<'PY'
import json, sys
k = (json.load(open(sys.argv[1])).get("host") or {}).get("kernels", {})
print("   busy", k.get("busy_share"), "decode steps", k.get("decode_steps"), "kernels", k.get("kernels"))
print("   runtime a decode step:", k.get("runtime_calls_per_decode_step"))
print("   idle by phase:", k.get("idle_ms_by_phase"))
PY
}
sa c32-k-off 95 $C; k c32-k-off
[ $(( $(date +%s) - PREPARE_T0 )) -lt 440 ] && { sa c32-k-on 110 $C --cuda-graphs; k c32-k-on; }
cd /tmp/j && tar -czf $OUT/json.tgz off-bounded.json c32-k-*.json && cd - > /dev/null
cat $S
