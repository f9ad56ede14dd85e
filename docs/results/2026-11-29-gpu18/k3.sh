#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried): k1.sh's check found a
# batch's life written in place unequal to MLX's updates (the kernel's own cases equal);
# which items differ, by how much, and whether MLX's own updates agree with themselves.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
timeout 200 python3 -P bench/kv_append.py --check --rounds 0 --out $OUT/kv-append.json > $OUT/kv-append.log 2>&1
echo "== kv_append: rc=$? $(elapsed)" >> $S
python3 - $OUT/kv-append.json >> $S 2>&1 <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["check"]["cases"]:
    if "batch_life" in c or not c["ok"]:
        print(c)
PY
cat $S
