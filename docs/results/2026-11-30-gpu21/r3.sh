#!/usr/bin/env bash
# Device run 3, right after r1 on the same machine (the 8B model and its kernels built).
# r1 found the bare 32-row step bound by the device, its decode attention (one block a row
# and key-value head at 32 rows) 5.4 of 11.1 ms a step. First the attention alone, its
# layers in sequence (last session's r5.sh: the engine's compile against MLX's and for
# sm_90a, 256/512 threads a block, vector value loads, the split forms at 512-2,048 target
# blocks, the kernel in service again last); then the 32-client load in-process
# (step_anatomy --kernels): the tree as it is, without the decode prelude, and with the
# split form at 1,024 target blocks.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
model_8b >> $S
timeout 240 python3 -P bench/ragged_attention.py --kernels --mlx-compiled --arch sm_90a \
  --threads 256 512 --vector-values --target-blocks 512 1024 2048 --again --out /tmp/j/ragged.json > /tmp/j/ragged.log 2>&1
echo "== ragged: rc=$? $(elapsed)" >> $S
python3 - /tmp/j/ragged.json >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("all_ok", d["all_ok"])
for t in [d["timing"], *d["more_timing"]]:
    print(t["rows"], t["lengths"], {k[:-len("_device_ms_per_step")]: v for k, v in t.items()
                                    if k.endswith("_device_ms_per_step")})
PY
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch --kernels --clients 32 --output-len 64:192"
sa c32-default 90 $A --duration 20
sa c32-no-prelude 90 $A --duration 20 --no-prelude
sa c32-blocks1024 90 $A --duration 20 --attention-blocks 1024
[ $(( $(date +%s) - PREPARE_T0 )) -lt 520 ] && sa c32-default-again 90 $A --duration 20
for f in /tmp/j/c32-*.json; do python3 -c "
import json,sys; h=json.load(open(sys.argv[1]))['host']; k=h['kernels']
print(sys.argv[1], h['tok_per_s'], h['ms_per_step'], k.get('busy_share'), k.get('kernels'), k.get('decode_steps'), k.get('idle_ms_by_phase'))" $f >> $S; done
cd /tmp/j && tar -czf $OUT/json.tgz ragged.json c32-*.json c32-*.log && cd - > /dev/null
cat $S
