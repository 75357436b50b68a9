#!/usr/bin/env bash
# Build Horovod 0.28.1 (PyTorch + Gloo, CPU; no MPI, TensorFlow or MXNet) from source into the current venv.
#
# Horovod's last release predates torch 2.13 and CMake 4, so two workarounds are needed:
# - gloo's bundled CMakeLists declare cmake_minimum_required < 3.5, which CMake >= 4 refuses:
#   CMAKE_POLICY_VERSION_MINIMUM=3.5 lets it configure;
# - torch 2.13's headers need C++17 while Horovod's CMake hard-codes -std=c++14: a compiler wrapper appends
#   -std=c++17 (the last -std flag wins).
# It builds against the torch already installed, so it needs --no-build-isolation (and cmake, g++, make).
# Not the horovod[spark] extra: it pins pyarrow<11 and petastorm, which break pyspark 4.2; horovod.spark.run
# needs only pyspark (already installed) and horovod's own deps (cloudpickle, psutil, pyyaml, packaging).
# Usage: scripts/install_horovod.sh [--wheel-dir DIR] [python]   (default: .venv/bin/python, else python3).
# --wheel-dir DIR builds the wheel into DIR and installs nothing (CI builds it while the suite runs, then installs it).
# 490-590 s on 2 shared cores.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEEL_DIR=""
if [[ "${1:-}" == "--wheel-dir" ]]; then
  WHEEL_DIR="${2:?--wheel-dir needs a folder}"
  shift 2
fi
PYTHON="${1:-}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"

for tool in cmake g++ make; do
  command -v "$tool" >/dev/null || { echo "install_horovod.sh: $tool is required (apt-get install cmake g++ make)" >&2; exit 2; }
done
"$PYTHON" -c "import torch" 2>/dev/null || { echo "install_horovod.sh: torch must be installed in $PYTHON first" >&2; exit 2; }

wrapper_dir="$(mktemp -d)"
trap 'rm -rf "$wrapper_dir"' EXIT
real_cxx="$(command -v g++)"
cat > "$wrapper_dir/g++-std17" <<WRAP
#!/usr/bin/env bash
exec "$real_cxx" "\$@" -std=c++17
WRAP
chmod +x "$wrapper_dir/g++-std17"

# setuptools/wheel/packaging are build requirements that --no-build-isolation takes from the venv
"$PYTHON" -m pip install -q "packaging" "wheel" "setuptools>=77"
if [[ -n "$WHEEL_DIR" ]]; then pip_action=(wheel --no-deps --wheel-dir "$WHEEL_DIR"); else pip_action=(install); fi
started=$(date +%s)
CXX="$wrapper_dir/g++-std17" \
CMAKE_POLICY_VERSION_MINIMUM=3.5 \
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO \
MAKEFLAGS="-j$(nproc)" \
  "$PYTHON" -m pip "${pip_action[@]}" --no-build-isolation --no-cache-dir "horovod==${HOROVOD_VERSION}"
echo "install_horovod.sh: built horovod ${HOROVOD_VERSION} in $(( $(date +%s) - started )) s"
[[ -n "$WHEEL_DIR" ]] && exit 0
"$PYTHON" -c "import horovod.torch as hvd; hvd.init(); print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else '', 'gloo built:', hvd.gloo_built(), 'size', hvd.size())"
