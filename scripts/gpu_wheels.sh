#!/usr/bin/env bash
# Fetch the wheels scripts/gpu_check.sh installs on a GPU machine that has no network: the
# packages daskhps needs that a CUDA image with torch, numpy, pandas and pyarrow usually lacks
# (dask, distributed, zarr and what they need), at the versions installed here.
#
#   scripts/gpu_wheels.sh [PYTHON_VERSION]      # default 3.12, the GPU machine's Python
#
# Writes .gpu-wheels/ (git-ignored; about 20 MiB). Copy it along with the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
python=${PYTHON:-python3}  # the Python whose installed versions are fetched
dest=.gpu-wheels
packages=(dask distributed zarr numcodecs donfig google-crc32c partd locket tblib zict tornado
  pydantic pydantic-core annotated-types typing-inspection typing-extensions bokeh xyzservices)
# dask reads its entry points through the importlib_metadata backport before Python 3.12.
case $py in 3.10|3.11) packages+=(importlib-metadata zipp lazy-importer) ;; esac
rm -rf "$dest" && mkdir -p "$dest"  # afresh: two versions of one package would stop the install
for name in "${packages[@]}"; do
  version=$("$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" \
    "$name" 2>/dev/null) || {
    echo "gpu_wheels: $name is not installed for $python; run pip install -e '.[test]' first" >&2
    exit 2
  }
  # manylinux tags from old to new: pip matches a platform tag exactly.
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$dest" "$name==$version"
done
echo "gpu_wheels: $(ls "$dest" | wc -l) wheels, $(du -sh "$dest" | cut -f1), in $dest"
