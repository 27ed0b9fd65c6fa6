#!/usr/bin/env bash
# Installs the Debian 12 packages attnlab needs, and only those dpkg reports as not installed, so a
# machine that has everything never calls apt-get. Extra package names may be given as arguments
# (.ci/run adds cmake for its install check). Then selects OpenBLAS's OpenMP build (below).
# Non-interactive; uses sudo when not root.
set -euo pipefail

PACKAGES=(
  meson ninja-build pkg-config g++
  libxtensor-dev libxtensor-blas-dev libopenblas-dev libopenblas-openmp-dev
  catch2 libbenchmark-dev libcli11-dev libfmt-dev libtomlplusplus-dev nlohmann-json3-dev
  gnuplot-nox openmpi-bin libopenmpi-dev
  python3-numpy python3-torch python3-dev pybind11-dev python3-pybind11
  clang clang-format libomp-dev doxygen
  bible-kjv  # the text task's corpus (training/tasks/text.cpp)
  "$@"
)

missing=()
for p in "${PACKAGES[@]}"; do
  # dpkg -s also knows removed packages whose config files remain: require "install ok installed".
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$p")
done
sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
if ((${#missing[@]} > 0)); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
fi

# OpenBLAS's OpenMP build instead of Debian's default, its pthreads build, for every program
# (PyTorch and NumPy too, so the peers run on the same OpenBLAS): attnlab's kernels and loops run
# on OpenMP, and the pthreads build's own pool of threads, spinning beside OpenMP's, made a
# training step slower on 2 cores (results/archive/training-speed/intel-167-openmp/).
# The OpenMP build runs OpenBLAS on OpenMP's threads: one pool.
arch=$(gcc -print-multiarch)
for link in libopenblas.so.0 libopenblas.so libblas.so.3 libblas.so liblapack.so.3 liblapack.so; do
  target=/usr/lib/$arch/openblas-openmp/$link
  if ! update-alternatives --query "$link-$arch" | grep -qx "Value: $target"; then
    echo "install-deps: selecting $target"
    "${sudo[@]}" update-alternatives --set "$link-$arch" "$target"
  fi
done
