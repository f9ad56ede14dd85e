#!/usr/bin/env bash
# Device run (two GPUs, kind x2; part 1 staged in /tmp/stage, part 2 carried), issue 33:
# where a tensor-parallel decode step's time goes, kernels by family and the device's busy
# time on rank 0, against the same step on one GPU, batch 32 (bench/sharded_step.py
# --kernels): the all-reduces themselves, or the host launching them.
set -u
source bench/device/prepare.sh
model_8b
LAUNCH="mlx.launch"; command -v mlx.launch >/dev/null || LAUNCH="python3 -m mlx._distributed_utils.launch"
timeout 150 python3 -P bench/sharded_step.py --model /tmp/l8b --batches 1 32 --steps 32 --kernels \
  --out $OUT/one.json > $OUT/one.log 2>&1; echo "one GPU: rc=$? $(elapsed)"
timeout 200 $LAUNCH -n 2 --backend nccl -- python3 -P bench/sharded_step.py --model /tmp/l8b \
  --batches 1 32 --steps 32 --kernels --out $OUT/tp2.json > $OUT/tp2.log 2>&1; echo "tp2: rc=$? $(elapsed)"
python3 - $OUT/one.json $OUT/tp2.json <<'PY'
import json,sys
for f in sys.argv[1:]:
    d=json.load(open(f)); print(f, {b: {k: round(v,2) for k,v in r.items()} for b,r in d["decode"].items()})
    print("  collectives", {b: round(r["wall_ms"],2) for b,r in d.get("collectives",{}).items()})
    k=d.get("kernels",{}); print("  kernels/step", k.get("kernels_per_step"), "busy ms/step", k.get("busy_ms_per_step"))
    for x in k.get("by_family", [])[:16]: print("   ", x)
PY
