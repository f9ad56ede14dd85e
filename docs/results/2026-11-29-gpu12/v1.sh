#!/usr/bin/env bash
# Device run 2 of the session (one GPU; part 1 staged in /tmp/stage, part 2 carried):
# installs MLX's CUDA build, checks the split short-query attention (bd2bbfd) against MLX's
# causal fallback on CUDA, then issue 32 item 5: the text streams beside image streams with
# the vision tower on a stream of its own (038dcee, this tree) against f2c0dbf's build (its
# two files in docs/results/2026-11-29-gpu11/), after an untimed load that builds the
# kernels (g9.sh's run met a fresh machine building them and measured nothing).
set -u
source bench/device/prepare.sh
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
S=$OUT/summary.txt
echo "installed: $(elapsed)" >> $S
python3 -m pytest -q -p no:cacheprovider tests/engine/test_ragged_cache.py > $OUT/ragged-tests.log 2>&1 \
  || python3 - >> $OUT/ragged-tests.log 2>&1 <<'PY'
import sys, mlx.core as mx
sys.path.insert(0, "src")
from mlx_nursery.engine._decode_attention import short_causal_attention
for L, h, kv, d, t in [(4, 4, 2, 64, mx.float32), (5, 9, 3, 64, mx.bfloat16), (9, 32, 8, 128, mx.bfloat16), (12, 8, 8, 96, mx.float16)]:
    k, v = mx.random.normal((2, 1, kv, 700 + L, d)).astype(t)
    q = mx.random.normal((1, h, L, d)).astype(t)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=d**-0.5, mask="causal")
    got = short_causal_attention(q, k, v, d**-0.5)
    err = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
    print("split", L, h, kv, d, t, "max error", err)
PY
tail -3 $OUT/ragged-tests.log | sed 's/^/ragged tests: /' >> $S
[ -f /tmp/qvl/config.json ] || python3 -m mlx_nursery make-model /tmp/qvl --preset qwen2.5-vl-3b \
  --dtype bfloat16 > /dev/null 2>&1
echo "vlm model: $(elapsed)" >> $S
HERE=docs/results/2026-11-29-gpu11
rm -rf /tmp/src-old && cp -r src /tmp/src-old
cp $HERE/previous_vision.py /tmp/src-old/mlx_nursery/engine/_vision.py
cp $HERE/previous_imaging.py /tmp/src-old/mlx_nursery/engine/_imaging.py
W="--model /tmp/qvl --images 1 --image-size 448x448 --input-len 64 --output-len 64:128 --mix temperature --temperature 0.7 --ignore-eos --warmup 8"
B="python3 -P bench/serving.py --url http://127.0.0.1:8102"
run() {  # run NAME SRC LOADS...: one server start of that build, then each load
  local name=$1 src=$2; shift 2
  PYTHONPATH=$src python3 -m mlx_nursery serve --model /tmp/qvl --port 8102 --max-concurrency 32 > /tmp/$name.server.log 2>&1 &
  for i in $(seq 1 1200); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8102/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
  echo "$name ready: $(elapsed)" >> $S
  for load in "$@"; do
    case $load in
      warm) a="--clients 32 --image-clients 8 --duration 25"; t=150 ;;
      text24) a="--clients 24 --image-clients 0 --duration 25"; t=90 ;;
      *) a="--clients 32 --image-clients 8 --duration 25"; t=90 ;;
    esac
    timeout $t $B $W $a --out $OUT/$name-$load.json > /tmp/$name-$load.log 2>&1
    grep -E '^\| http' /tmp/$name-$load.log | head -3 | sed "s/^/$name $load /" >> $S
    echo "  $(elapsed)" >> $S
  done
  pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 40); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done; pkill -9 -f "mlx_nursery serve"
}
run own-stream $PWD/src warm text24 mixed
run waited /tmp/src-old mixed
run own-stream2 $PWD/src mixed
cat $S
