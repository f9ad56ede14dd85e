# Sourced by this directory's device scripts after bench/device/prepare.sh and
# docs/results/2026-11-29-gpu19/lib.sh (`sa`): `bs NAME LIMIT GRAPHS ARGS...` runs
# bench/batch_step.py on the 8B model with MLX's CUDA graphs GRAPHS (1 on, 0 off) into
# /tmp/j/NAME.json and appends each variant's step, kernels, busy time and the host's
# graph calls a step to $S.
bs() {
  local name=$1 t=$2 g=$3; shift 3
  MLX_USE_CUDA_GRAPHS=$g timeout $t python3 -P bench/batch_step.py --model /tmp/l8b --rows 32 \
    "$@" --out /tmp/j/$name.json > /tmp/j/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  python3 - /tmp/j/$name.json >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    k = r.get("kernels", {})
    print(" ", d["cuda_graphs"], r["variant"], {x: r[x] for x in ("wall_ms_per_step", "launch_ms_per_step", "wait_ms_per_step", "python_ms_per_step", "tok_per_s")},
          "kernels", k.get("kernels_per_step"), "busy", k.get("busy_ms_per_step"))
    for f in k.get("by_family", [])[:6]:
        print("   ", f)
    calls = k.get("runtime_calls_per_step", {})
    print("    runtime a step:", dict(list(calls.items())[:10]))
PY
}
