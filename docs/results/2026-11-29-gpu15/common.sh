# Sourced by this session's device scripts (after bench/device/prepare.sh): the engine
# in-process under bench/step_anatomy.py, and a served load, each run under an environment
# of its own (`OPS=N` sets MLX_MAX_OPS_PER_BUFFER for that process alone; empty: MLX's own).
S=$OUT/summary.txt
anat() {  # anat NAME OPS CLIENTS DURATION [more step_anatomy args]
  local name=$1 ops=$2 clients=$3 duration=$4; shift 4
  local env=(); [ -n "$ops" ] && env=(MLX_MAX_OPS_PER_BUFFER=$ops)
  local shape=(--input-len 500:1000 --output-len 64:192 --temperature 0.7)
  [ "$clients" = 1 ] && shape=(--input-len 500:1000 --output-len 128 --temperature 0)
  env "${env[@]}" timeout $(( duration + 150 )) python3 -P bench/step_anatomy.py --model /tmp/l8b \
    --clients $clients "${shape[@]}" --duration $duration --mode host --launch "$@" \
    --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name (ops ${ops:-default}, $clients clients): rc=$? $(elapsed)" >> $S
  python3 - $OUT/$name.json >> $S 2>&1 <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["host"]
print("  ", {k: h[k] for k in ("requests", "tokens", "tok_per_s", "steps", "ms_per_step")})
for k, v in list(h["phases"].items())[:9]:
    print(f"    {k:18s} {v['ms_per_step']:7.2f} ms/step  calls {v['calls']}")
PY
}
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null; }
load() {  # load NAME LIMIT bench/serving.py ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b "$@" \
    --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "  $name: rc=$? $(elapsed)" >> $S
  grep -E '^\| http' /tmp/$name.log | head -1 >> $S
}
serve() {  # serve NAME OPS: the 32-client load (GPU busy sampled), then one greedy client
  local name=$1 ops=$2 env=()
  [ -n "$ops" ] && env=(MLX_MAX_OPS_PER_BUFFER=$ops)
  env "${env[@]}" python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 \
    > /tmp/$name.server.log 2>&1 &
  local server=$!
  for i in $(seq 1 1200); do health && break; sleep 0.25; done
  echo "== $name (ops ${ops:-default}) ready: $(elapsed)" >> $S
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 > /tmp/$name.gpu.txt &
  local gpu=$!
  load $name-c32 110 --clients 32 --input-len 500:1000 --output-len 64:192 --mix temperature \
    --temperature 0.7 --ignore-eos --duration 40 --warmup 8
  kill $gpu
  python3 - /tmp/$name.gpu.txt >> $S <<'PY'
import sys
v = [float(l) for l in open(sys.argv[1]) if l.strip()]
mid = v[len(v) // 5 : len(v) * 4 // 5] or v
print(f"  GPU busy: mean {sum(mid) / max(1, len(mid)):.0f}% over the middle 60% of {len(v)} samples")
PY
  load $name-c1 60 --clients 1 --input-len 500:1000 --output-len 128 --mix greedy --ignore-eos \
    --duration 30 --warmup 1
  kill -INT $server; wait $server
}
