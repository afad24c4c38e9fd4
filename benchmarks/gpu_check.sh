#!/usr/bin/env bash
# One prepared pass over the GPU paths (AMP, NCCL DDP, pin_memory) for a lent GPU machine:
#
#   bash benchmarks/gpu_check.sh OUTDIR
#
# Each step is time-boxed (one hang must not cost the rest of a short lease), writes its whole
# log to OUTDIR/<step>.log and prints its last lines; OUTDIR/summary.txt gets one line per step.
# GPU_CHECK_STEPS="gpu_tests precision" runs only the steps named (a rerun of failed ones).
# Where the machine lacks hpsearch's packages and ./.whl holds wheels, they are installed into
# /tmp/site (benchmarks/gpu_check_wheels.py prepares ./.whl for a machine with no package index).
set -u
out=${1:-gpu-check}
mkdir -p "$out"
: > "$out/summary.txt"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
py=${PYTHON:-python3}

if ! "$py" -c "import hpsearch, ray.tune, optuna" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

step() {  # step NAME SECONDS TAIL_LINES COMMAND...
  local name=$1 limit=$2 lines=$3 started rc
  shift 3
  if [ -n "${GPU_CHECK_STEPS:-}" ] && [[ " $GPU_CHECK_STEPS " != *" $name "* ]]; then return 0; fi
  started=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc in $(( $(date +%s) - started )) s" | tee -a "$out/summary.txt"
  tail -n "$lines" "$out/$name.log"
}

step env 60 20 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv; nproc; \
  $py -c 'import torch, pytorch_lightning, ray, optuna, pydantic, hpsearch; \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"lightning\", pytorch_lightning.__version__, \
\"ray\", ray.__version__, \"optuna\", optuna.__version__, \"bf16\", torch.cuda.is_bf16_supported())'"

step nccl 100 6 "$py" benchmarks/nccl_check.py

step gpu_tests 300 25 "$py" -m pytest -v -p no:cacheprovider -o addopts="" -m gpu tests/test_gpu.py tests/test_trial_setup.py

step precision 240 12 "$py" benchmarks/precision_and_ddp.py

# Two DDP ranks packed onto one GPU: NCCL refused them on the H200 of 2026-12-04 ("Duplicate
# GPU detected", nccl_check above), so validation must refuse the request before Ray starts.
step ddp_shared_gpu 60 3 "$py" - <<'EOF'
import hpsearch
from hpsearch.search.errors import ConfigError
try:
    hpsearch.check("examples/digits-cnn.yaml", {
        "resources": {"workers_per_trial": 2, "cpus_per_worker": 1, "gpus_per_worker": 0.5}})
except ConfigError as error:
    print(f"refused, as it must be: {error}")
else:
    raise SystemExit("two DDP ranks on one GPU were accepted")
EOF

step loader 180 12 "$py" benchmarks/loader.py --images 3000 --cpus 4 --rounds 3

echo "== summary"; cat "$out/summary.txt"
