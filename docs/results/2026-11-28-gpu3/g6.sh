#!/usr/bin/env bash
# Device run (one H100), issue 32's start on a warm disk: the 8B served twice in a row (the
# second start finds the first's kernels on disk and the weights in the page cache); after
# each start, the first requests' TTFT (one lone request, then 8 at once with new lengths).
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
[ -d ${MODEL:-/tmp/l8b} ] || python3 -m mlx_nursery make-model ${MODEL:-/tmp/l8b} --preset llama-3.1-8b --dtype bfloat16 > $OUT/make8.log 2>&1
cat ${MODEL:-/tmp/l8b}/*.safetensors > /dev/null; echo "model: $(( $(date +%s) - t0 )) s"
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health',timeout=2).status==200 else 1)" 2>/dev/null; }
B="python3 -P bench/serving.py --url http://127.0.0.1:8100 --model ${MODEL:-/tmp/l8b} --ignore-eos --warmup 0 --save-records"
for n in 1 2; do
  python3 -m mlx_nursery serve --model ${MODEL:-/tmp/l8b} --port 8100 --max-concurrency 32 > $OUT/start$n.log 2>&1 &
  s=$(date +%s.%N); for i in $(seq 1 1200); do health 8100 && break; sleep 0.1; done
  echo "start $n: ready after $(python3 -c "import time;print(round(time.time()-$s,1))") s"
  timeout 40 $B --clients 1 --input-len 300 --output-len 16 --mix greedy:1 --duration 3 --out $OUT/first$n-one.json > /dev/null 2>&1
  timeout 60 $B --clients 8 --input-len 700:1500 --output-len 16:32 --mix temperature --temperature 0.7 --duration 8 --out $OUT/first$n-eight.json > /dev/null 2>&1
  python3 - "$OUT/first$n-one.json" "$OUT/first$n-eight.json" <<'PY'
import json, sys
def walk(node):
    if isinstance(node, dict):
        if isinstance(node.get("records"), list):
            yield node["records"]
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)
for path in sys.argv[1:]:
    try:
        d = json.load(open(path))
    except Exception as e:
        print(path, "no json", e); continue
    for recs in walk(d):
        ttft = sorted(r["ttft"] for r in recs if r.get("ttft") is not None)
        print(path.rsplit("/", 1)[-1], "requests", len(recs), "ttft first/max s",
              round(ttft[0], 3) if ttft else None, round(ttft[-1], 3) if ttft else None)
PY
  grep -E "warm-up" $OUT/start$n.log | tail -3
  pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 60); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done; pkill -9 -f "mlx_nursery serve"
done
echo "total: $(( $(date +%s) - t0 )) s"
