#!/usr/bin/env bash
# Prepared for the next session, not run (this session's device time was spent): device
# run 2 of a fresh machine (part 1 staged, part 2 carried). The decode attention's device
# time with its steps in sequence (CUDA graphs off, as the engine runs; r4 found the kernel's
# earlier times had overlapped under graphs): the engine's compile against MLX's of the
# same source (r4: MLX's 1.4x faster) and for sm_90a (MLX's target on a Hopper), the whole
# form with 256 and 512 threads a block (more warps over a row's keys, no extra launch),
# a lane reading a key's values in one load (--vector-values),
# and the split forms at 512-2,048 target blocks (one more launch a layer); the kernel in
# service timed again last (r4 timed the engine's compile first, MLX's second: the drift).
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
timeout 240 python3 -P bench/ragged_attention.py --kernels --mlx-compiled --arch sm_90a \
  --threads 256 512 --vector-values --target-blocks 512 1024 2048 --again --out $OUT/ragged.json > $OUT/ragged.log 2>&1
echo "== ragged: rc=$? $(elapsed)" >> $S
python3 - $OUT/ragged.json >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("all_ok", d["all_ok"])
for t in [d["timing"], *d["more_timing"]]:
    print(t["rows"], t["lengths"], {k[:-len("_device_ms_per_step")]: v for k, v in t.items()
                                    if k.endswith("_device_ms_per_step")})
PY
cat $S
