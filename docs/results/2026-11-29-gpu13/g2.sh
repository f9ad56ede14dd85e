#!/usr/bin/env bash
# Device run 3 (the machine of g1.sh, warm): a lone stream with MLX's CUDA graphs on
# (`serve --cuda-graphs`; off by default since decisions/0046, whose lone-stream cost was not
# measured through the server), the same loads as g1.sh; mlx_lm.server on the shared prompt;
# then where a lone step's time goes in-process (`bench/step_anatomy.py --clients 1`).
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
model_8b >> $S
python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 --cuda-graphs > /tmp/graphs.server.log 2>&1 &
SERVER=$!
for i in $(seq 1 1600); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
echo "graphs ready: $(elapsed)" >> $S
B="python3 -P bench/serving.py --model /tmp/l8b"
load() {  # load NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t $B "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name: rc=$? $(elapsed)" >> $S
  grep -E '^\| (http|mlx_lm)' /tmp/$name.log | head -2 >> $S
}
P="--prefix-len 8000 --input-len 16:48 --output-len 16 --mix greedy --ignore-eos"
load graphs-one 80 --url http://127.0.0.1:8100 --clients 1 --input-len 500:1000 --output-len 128 --mix greedy --ignore-eos --duration 30 --warmup 2
load graphs-prefix8k 90 --url http://127.0.0.1:8100 --clients 1 --num-requests 30 --warmup 2 $P
kill -INT $SERVER; wait $SERVER
load mlx-lm-prefix8k 150 --server mlx_lm --clients 1 --num-requests 30 --warmup 2 $P
timeout 120 python3 -P bench/step_anatomy.py --model /tmp/l8b --clients 1 --input-len 500:1000 \
    --output-len 128 --temperature 0 --duration 20 --mode host --launch \
    --out $OUT/anatomy-lone.json > /tmp/anatomy.log 2>&1
echo "anatomy-lone: rc=$? $(elapsed)" >> $S
python3 - >> $S <<'PY'
import json, os
h = json.load(open(os.environ["OUT"] + "/anatomy-lone.json"))["host"]
print({k: v for k, v in h.items() if k not in ("phases", "memory", "kernels")})
for k, v in sorted(h["phases"].items(), key=lambda kv: -kv[1]["seconds"])[:10]:
    print(f"  {k:22s} {v['ms_per_step']:6.2f} ms/step  calls={v['calls']}")
PY
cat $S
