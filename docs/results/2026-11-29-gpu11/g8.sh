#!/usr/bin/env bash
# Device run (one GPU; part 1 staged in /tmp/stage, part 2 carried), issue 32 item 5: the text
# streams' time per token beside image streams, with image prompts' encoding and prefill
# chunks launched beside the decode step (4781bfc) against waited for on the engine thread
# (f2c0dbf's _vision.py and _imaging.py, kept beside this script). Qwen2.5-VL-3B shapes, bf16,
# random weights, the workload of g6.sh (call-4): 24 text clients alone, then 24 text + 8
# image; two rounds, the order of the builds reversed in the second.
set -u
source bench/device/prepare.sh
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python3 -c "import mlx_vlm" || { echo "no mlx_vlm"; exit 4; }
[ -f /tmp/qvl/config.json ] || python3 -m mlx_nursery make-model /tmp/qvl --preset qwen2.5-vl-3b \
  --dtype bfloat16 > $OUT/make-qvl.log 2>&1
echo "model: $(elapsed)"
HERE=docs/results/2026-11-29-gpu11
rm -rf /tmp/src-old && cp -r src /tmp/src-old
cp $HERE/previous_vision.py /tmp/src-old/mlx_nursery/engine/_vision.py
cp $HERE/previous_imaging.py /tmp/src-old/mlx_nursery/engine/_imaging.py
W="--model /tmp/qvl --images 1 --image-size 448x448 --input-len 64 --output-len 64:128 --mix temperature --temperature 0.7 --ignore-eos"
B="python3 -P bench/serving.py --url http://127.0.0.1:8102"
run() {  # run NAME SRC: one server start of that build, text24 then mixed
  local name=$1 src=$2
  PYTHONPATH=$src python3 -m mlx_nursery serve --model /tmp/qvl --port 8102 --max-concurrency 32 > $OUT/$name.server.log 2>&1 &
  for i in $(seq 1 1200); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8102/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
  echo "$name ready: $(elapsed)"
  timeout 80 $B $W --clients 24 --image-clients 0 --duration 25 --warmup 8 --out $OUT/$name-text24.json > $OUT/$name-text24.log 2>&1
  timeout 80 $B $W --clients 32 --image-clients 8 --duration 25 --warmup 8 --out $OUT/$name-mixed.json > $OUT/$name-mixed.log 2>&1
  pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 40); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done; pkill -9 -f "mlx_nursery serve"
  echo "  text24: $(grep -E '^\| http' $OUT/$name-text24.log | head -1)"
  echo "  mixed:  $(grep -E '^\| http.*\(text\)' $OUT/$name-mixed.log | head -1)"
  echo "  mixed:  $(grep -E '^\| http.*\(image\)' $OUT/$name-mixed.log | head -1)"
  echo "  $(elapsed)"
}
run r1-launched $PWD/src
run r1-waited /tmp/src-old
run r2-waited /tmp/src-old
run r2-launched $PWD/src
