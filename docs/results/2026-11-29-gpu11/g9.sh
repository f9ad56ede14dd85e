#!/usr/bin/env bash
# Device run (one GPU; part 1 staged in /tmp/stage, part 2 carried), issue 32 item 5, after g8.sh
# (which ran past its limit after one round): the text streams beside image streams with the
# image encoder on a stream of its own and its chunks launched (038dcee, this tree) against
# f2c0dbf's (encoder and chunks waited for; its two files beside this script). One round,
# shorter loads (20 s), the summary written as it goes to $OUT/summary.txt.
# Ran 2026-11-29 04:08 UTC on a fresh machine (the lease had been given back), with the session's
# last device time: the first start built every kernel (ready 82 s after the model), the 24-text
# load found kernels still building and ended at its 70 s limit without a result, and the call
# ended at its own limit (call-9/summary.txt). Nothing measured; run it on a machine that has
# served this model already (after g6.sh), or give the loads longer limits.
set -u
source bench/device/prepare.sh
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
S=$OUT/summary.txt
[ -f /tmp/qvl/config.json ] || python3 -m mlx_nursery make-model /tmp/qvl --preset qwen2.5-vl-3b \
  --dtype bfloat16 > /dev/null 2>&1
echo "model: $(elapsed)" >> $S
HERE=docs/results/2026-11-29-gpu11
rm -rf /tmp/src-old && cp -r src /tmp/src-old
cp $HERE/previous_vision.py /tmp/src-old/mlx_nursery/engine/_vision.py
cp $HERE/previous_imaging.py /tmp/src-old/mlx_nursery/engine/_imaging.py
W="--model /tmp/qvl --images 1 --image-size 448x448 --input-len 64 --output-len 64:128 --mix temperature --temperature 0.7 --ignore-eos --duration 20 --warmup 8"
B="python3 -P bench/serving.py --url http://127.0.0.1:8102"
run() {  # run NAME SRC LOADS...: one server start of that build, then each load
  local name=$1 src=$2; shift 2
  PYTHONPATH=$src python3 -m mlx_nursery serve --model /tmp/qvl --port 8102 --max-concurrency 32 > /tmp/$name.server.log 2>&1 &
  for i in $(seq 1 1200); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8102/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
  echo "$name ready: $(elapsed)" >> $S
  for load in "$@"; do
    if [ $load = text24 ]; then a="--clients 24 --image-clients 0"; else a="--clients 32 --image-clients 8"; fi
    timeout 70 $B $W $a > /tmp/$name-$load.log 2>&1
    grep -E '^\| http' /tmp/$name-$load.log | head -3 | sed "s/^/$name $load /" >> $S
    echo "  $(elapsed)" >> $S
  done
  pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 40); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done; pkill -9 -f "mlx_nursery serve"
}
run own-stream $PWD/src text24 mixed
run waited /tmp/src-old mixed
cat $S
