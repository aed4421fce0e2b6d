#!/usr/bin/env bash
# The CUDA checks and benchmarks, in one run, on a machine with an NVIDIA GPU and a python3 that
# holds torch with CUDA (the figures in docs/mcts.md and docs/policy.md come from this script).
#
#   benchmarks/cuda_checks.sh OUTDIR [SMOLLM2_CONFIG_FOLDER]
#
# - the hf policy tests and the whole-search mcts tests, on CUDA only (-k cuda);
# - bench_mcts.py on CUDA (mctx on JAX's GPU backend beside it when mctx imports);
# - bench_mcts.py --compiled on CUDA (adds torch.compile's Triton path; minutes of compiling);
# - bench_policy.py on CUDA, float32 and bfloat16 (DTYPES picks).
# Without the SmolLM2 checkpoint (a GPU machine with no network and a 64 MiB upload, say), pass
# a folder holding SmolLM2's config.json and tokenizer files: the policy benchmark then runs that
# architecture with seeded random weights (rows seldom end early, so every mode generates nearly
# the full length; its path names it): ~/.cache/dataengine/models/smollm2 without model.safetensors.
# Wheels in .whl/ are installed to /tmp/site first: on the lent H200 image (torch 2.11, no network)
# that was transformers 5.23.0, pydantic 2.14.3 (+ pydantic-core, annotated-types,
# typing-inspection, typing-extensions), jsonschema 4.26.0 (+ jsonschema-specifications,
# referencing, rpds-py), trl 1.16.0 (+ datasets, dill, multiprocess) and mctx 0.0.71; and
# DATAENGINE_CACHE pointed at a folder holding models/tiny (the tests' tiny model).
set -u
OUT=${1:?usage: benchmarks/cuda_checks.sh OUTDIR [SMOLLM2_CONFIG_FOLDER]}
CONFIG=${2:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi -L
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

MODEL=smollm2
if [ -n "$CONFIG" ]; then
  MODEL=/tmp/smollm2-random-weights
  $PY - "$CONFIG" "$MODEL" <<'EOF' || exit 1
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32).save_pretrained(dst)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, dst / f.name)
print("random-weight SmolLM2 architecture at", dst)
EOF
fi

# Each step runs whatever the last one did; its log comes back either way. STEPS picks some.
STEPS=${STEPS:-tests mcts compiled policy}
[[ $STEPS == *tests* ]] && timeout 150 $PY -m pytest -q -p no:cacheprovider -k cuda -rs tests/test_policy.py tests/test_mcts_search.py 2>&1 | tee "$OUT/tests_cuda.log"
[[ $STEPS == *mcts* ]] && timeout 150 $PY benchmarks/bench_mcts.py --device cuda --repeats 2 2>&1 | tee "$OUT/bench_mcts_cuda.log"
[[ $STEPS == *compiled* ]] && timeout 200 $PY benchmarks/bench_mcts.py --device cuda --repeats 2 --compiled 2>&1 | tee "$OUT/bench_mcts_compiled_cuda.log"
[[ $STEPS == *policy* ]] && for dtype in ${DTYPES:-float32 bfloat16}; do
  timeout 120 $PY benchmarks/bench_policy.py --device cuda --dtype $dtype --model "$MODEL" \
    --modes generate,copy_k,new --json "$OUT/bench_policy_cuda_$dtype.json" 2>&1 | tee "$OUT/bench_policy_cuda_$dtype.log"
done
