# Sourced by this directory's device scripts after bench/device/prepare.sh: `sa NAME LIMIT
# ARGS...` runs bench/step_anatomy.py into /tmp/j/NAME.json and appends its summary (each
# mode's rate, step and first seven phases) to $S.
mkdir -p /tmp/j
report() {
  python3 - /tmp/j/$1.json >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for mode in ("host", "sync"):
    h = d.get(mode)
    if not h:
        continue
    print(f"  [{mode}]", {k: h.get(k) for k in ("requests", "tok_per_s", "ms_per_step", "ttft_ms_p50")})
    for k, v in list(h["phases"].items())[:9]:
        print(f"    {k:18s} {v['ms_per_step']:7.2f} ms/step  calls {v['calls']}")
PY
}
sa() {
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/step_anatomy.py "$@" --out /tmp/j/$name.json > /tmp/j/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  report $name
}
