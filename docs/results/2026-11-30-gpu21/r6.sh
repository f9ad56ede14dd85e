#!/usr/bin/env bash
# Prepared for the next session, not run: device run 2 of a fresh machine (part 1 staged;
# part 2 and .bisect carried). r1 ran the bare 32-row decode step (bench/batch_step.py) at
# 17.9 ms a step where 67da07b's run, on another H200, took 9.7: this runs the same
# benchmark, the engine's variant only, at the commits between, each tree's own src and
# bench, in one process each after a first that builds the kernels. Before the call, here:
#   for c in 67da07b 8aff435 ae3d722 5918595 57ef364 HEAD; do mkdir -p .bisect/$c &&
#     git archive $c src bench | tar -x -C .bisect/$c; done
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
mkdir -p /tmp/b
step() {  # step COMMIT LIMIT
  local c=$1 t=$2
  (cd .bisect/$c && PYTHONPATH=$PWD/src timeout $t python3 -P bench/batch_step.py --model /tmp/l8b \
    --rows 32 --context 500:1000 --kernels --variants ours --out /tmp/b/$c.json > /tmp/b/$c.log 2>&1)
  echo "== $c: rc=$? $(elapsed)" >> $S
  python3 - /tmp/b/$c.json >> $S 2>&1 <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    k = r.get("kernels", {})
    print(" ", {x: r[x] for x in ("wall_ms_per_step", "launch_ms_per_step", "python_ms_per_step", "tok_per_s")},
          "kernels", k.get("kernels_per_step"), "busy", k.get("busy_ms_per_step"))
    for f in k.get("by_family", [])[:8]:
        print("   ", f)
PY
}
step HEAD 260  # builds the kernels
for c in 67da07b 8aff435 ae3d722 5918595 57ef364 HEAD; do
  [ $(( $(date +%s) - PREPARE_T0 )) -lt 520 ] && step $c 90
done
cd /tmp/b && tar -czf $OUT/json.tgz *.json && cd - > /dev/null
cat $S
