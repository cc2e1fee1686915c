#!/usr/bin/env bash
# The prepared GPU check, one command, within 8 minutes on one GPU:
#
#   scripts/gpu_check.sh [OUT_DIR]          # default gpu-check/
#   scripts/gpu_check.sh --cpu [OUT_DIR]    # the same steps on a machine without CUDA (a smoke run)
#
# 1. Makes dask, distributed and zarr importable: where they are missing it installs the wheels
#    of .gpu-wheels/ (fetched beforehand by scripts/gpu_wheels.sh) into a temporary folder;
#    nothing is fetched, so the GPU machine needs no network. daskhps itself runs from this
#    checkout (PYTHONPATH), not installed.
# 2. Runs the tests marked gpu (pytest -m gpu): the CUDA device tier, nccl groups,
#    LocalCUDACluster, cuDF reading where cudf is installed, CUDA models and serving.
# 3. Runs scripts/bench_gpu.py: the CUDA device tier against a CUDA gather and index_copy_, one
#    training pass on CUDA against the same pass on the CPU.
# It prints the figures and writes OUT_DIR/{environment.txt,pytest.txt,figures.txt,figures.jsonl}.
# Exit status: 0 when every step passed, 1 when a step failed, 2 when it could not start.
set -uo pipefail
cd "$(dirname "$0")/.."
device=cuda
if [ "${1:-}" = "--cpu" ]; then device=cpu; shift; fi
out=${1:-gpu-check}
python=${PYTHON:-python3}
mkdir -p "$out"
started=$(date +%s)

if ! "$python" -c "import dask, distributed, zarr, pydantic" 2>/dev/null; then
  if ! ls .gpu-wheels/*.whl >/dev/null 2>&1; then
    echo "gpu_check: dask, distributed or zarr is missing and .gpu-wheels/ holds no wheels;" \
      "run scripts/gpu_wheels.sh on a machine with network access and copy .gpu-wheels/ here" >&2
    exit 2
  fi
  site=$(mktemp -d "${TMPDIR:-/tmp}/daskhps-gpu-site.XXXXXX")
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    .gpu-wheels/*.whl || { echo "gpu_check: installing .gpu-wheels/ failed" >&2; exit 2; }
  export PYTHONPATH="$site"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  "$python" -c "import torch, dask, zarr; print('python', __import__('sys').version.split()[0],
'torch', torch.__version__, 'cuda', torch.version.cuda, 'dask', dask.__version__,
'zarr', zarr.__version__)"
  if [ "$device" = cuda ]; then nvidia-smi -L 2>&1 || true; fi
  uptime
} | tee "$out/environment.txt"
if [ "$device" = cuda ] && ! "$python" -c "import torch; assert torch.cuda.is_available()"; then
  echo "gpu_check: torch sees no CUDA device here; run with --cpu for a smoke run" >&2
  exit 2
fi

failed=()
# Only the files that hold gpu tests: collecting the whole suite would need its CPU-only
# test dependencies too, and the time is the GPU's.
mapfile -t files < <(grep -rl --include='*.py' 'mark.gpu' tests | sort)
timeout 270 "$python" -m pytest -m gpu -q -p no:cacheprovider \
  "${files[@]}" 2>&1 | tee "$out/pytest.txt"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || failed+=("pytest -m gpu (exit $rc)")

bench=(--device "$device" --out "$out/figures.jsonl")
[ "$device" = cuda ] || bench+=(--quick)
timeout 150 "$python" scripts/bench_gpu.py "${bench[@]}" 2>&1 | tee "$out/figures.txt"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || failed+=("scripts/bench_gpu.py (exit $rc)")

echo "gpu_check: $(( $(date +%s) - started )) s; results in $out/"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'gpu_check: failed: %s\n' "${failed[@]}"
  exit 1
fi
echo "gpu_check: every step passed"
