#!/usr/bin/env bash
# Device run (one GPU; part 1 staged in /tmp/stage, part 2 carried: it now holds mlx-vlm's
# wheel, installed with the rest), issue 32 item 5, prepared and not yet run: vision since
# issue 19's runs (2026-11-23, before the ragged cache, its kernel and the fused
# projections, which a VLM's language model gets too). Qwen2.5-VL-3B shapes, bf16, random
# weights; one 448x448 JPEG and 64 text tokens a request, 64-128 out, T 0.7, EOS ignored.
# On one server (batching up to 32): 8 image clients against 1 (one at a time: the target is
# >= 3x), then 24 text clients alone, 24 text + 8 image, and 24 text alone again (the text
# streams' TPOT with the images beside them: target <= 1.3x text-only).
set -u
source bench/device/prepare.sh
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python3 -c "import mlx_vlm" || { echo "no mlx_vlm"; exit 4; }
[ -f /tmp/qvl/config.json ] || python3 -m mlx_nursery make-model /tmp/qvl --preset qwen2.5-vl-3b \
  --dtype bfloat16 > $OUT/make-qvl.log 2>&1
echo "model: $(elapsed)"
W="--model /tmp/qvl --images 1 --image-size 448x448 --input-len 64 --output-len 64:128 --mix temperature --temperature 0.7 --ignore-eos"
B="python3 -P bench/serving.py --url http://127.0.0.1:8102"
python3 -m mlx_nursery serve --model /tmp/qvl --port 8102 --max-concurrency 32 > $OUT/vision.server.log 2>&1 &
for i in $(seq 1 1200); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8102/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
echo "ready: $(elapsed)"
timeout 90 $B $W --clients 8 --duration 30 --warmup 8 --out $OUT/v-c8.json > $OUT/v-c8.log 2>&1; echo "c8 $(elapsed)"
timeout 90 $B $W --clients 1 --duration 30 --warmup 2 --out $OUT/v-c1.json > $OUT/v-c1.log 2>&1; echo "c1 $(elapsed)"
timeout 90 $B $W --clients 24 --image-clients 0 --duration 30 --warmup 8 --out $OUT/v-text24.json > $OUT/v-text24.log 2>&1; echo "text24 $(elapsed)"
timeout 90 $B $W --clients 32 --image-clients 8 --duration 30 --warmup 8 --out $OUT/v-mixed.json > $OUT/v-mixed.log 2>&1; echo "mixed $(elapsed)"
timeout 90 $B $W --clients 24 --image-clients 0 --duration 30 --warmup 2 --out $OUT/v-text24b.json > $OUT/v-text24b.log 2>&1; echo "text24 again $(elapsed)"
pkill -INT -f "mlx_nursery serve"; sleep 3; pkill -9 -f "mlx_nursery serve"
for f in c8 c1 text24 mixed text24b; do echo "$f: $(grep -E '^\| http' $OUT/v-$f.log | head -1)"; done
