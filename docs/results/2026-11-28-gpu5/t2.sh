#!/usr/bin/env bash
# Device run (two H200s), call B, issue 33 (and 32): the bare sharded step with each step's
# record sent as the server sends it (on the step's NCCL stream) or over a second group of
# MLX's ring backend on the CPU stream; each with MLX's default command buffers and with
# one buffer a step (MLX_MAX_OPS_PER_BUFFER: more than 10 buffers in flight make
# async_eval wait for one to finish). Then one GPU, both buffer settings.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
LAUNCH="mlx.launch"; command -v mlx.launch >/dev/null || LAUNCH="python3 -m mlx._distributed_utils.launch"
S="python3 -P bench/sharded_step.py --model /tmp/l8b --batches 1 32 --steps 32"
timeout 170 $LAUNCH -n 2 --backend nccl -- $S --records none nccl ring --out $OUT/tp2-default.json > $OUT/tp2-default.log 2>&1; echo "tp2 default: rc=$? $(( $(date +%s) - t0 )) s"
MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=100000 timeout 150 $LAUNCH -n 2 --backend nccl -- $S --records none nccl ring --out $OUT/tp2-one-buffer.json > $OUT/tp2-one-buffer.log 2>&1; echo "tp2 one buffer: rc=$? $(( $(date +%s) - t0 )) s"
CUDA_VISIBLE_DEVICES=0 timeout 100 $S --out $OUT/one-default.json > $OUT/one-default.log 2>&1; echo "one default: rc=$? $(( $(date +%s) - t0 )) s"
CUDA_VISIBLE_DEVICES=0 MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=100000 timeout 100 $S --out $OUT/one-one-buffer.json > $OUT/one-one-buffer.log 2>&1; echo "one one buffer: rc=$? $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/*.json")):
    try: d = json.load(open(f))
    except Exception as e: print(f, e); continue
    if "decode" not in d: continue
    for k, v in d.items():
        if k.startswith("decode") or k == "collectives":
            print(os.path.basename(f), k, {b: (round(r["host_ms"], 2), round(r["wall_ms"], 2)) for b, r in v.items()})
PY
tail -5 $OUT/tp2-default.log
