# SPDX-License-Identifier: Apache-2.0
# Shared by scripts/run.sh and scripts/test.sh: install what is missing
# (Debian/Ubuntu, as root), then configure and build into $BUILD_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

install_missing() {
  local wanted=(cmake make g++ gcc pkg-config binutils libabsl-dev libgtest-dev "$@")
  local missing=()
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

# CUDA architectures: the GPU's own where there is one; where there is none
# (CI), one architecture so the kernels still compile, quickly.
cuda_archs() {
  if [ -n "${KVPAGE_CUDA_ARCHS:-}" ]; then echo "$KVPAGE_CUDA_ARCHS"
  elif has_gpu; then echo native
  else echo 90a
  fi
}

configure_and_build() {
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="$(cuda_archs)" "$@"
  cmake --build "$BUILD_DIR" -j "$JOBS"
}
