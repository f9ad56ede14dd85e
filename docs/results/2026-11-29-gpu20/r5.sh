#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried): r4 again with the split
# forms (512-2,048 target blocks) and the engine's compile for sm_90a (MLX's target on a Hopper)
# compiled by MLX, in one process (bench/ragged_attention.py --kernels --mlx-compiled): the
# served step's attention ran 171 us a layer (r2) where MLX's compile had measured ~50.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
timeout 150 python3 -P bench/ragged_attention.py --kernels --mlx-compiled --arch sm_90a --target-blocks 512 1024 2048 --out $OUT/ragged.json > $OUT/ragged.log 2>&1
echo "== ragged: rc=$? $(elapsed)" >> $S
python3 - $OUT/ragged.json >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("all_ok", d["all_ok"])
for t in [d["timing"], *d["more_timing"]]:
    print({k: v for k, v in t.items() if "kernels" not in k and "x_masked" not in k})
PY
cat $S
