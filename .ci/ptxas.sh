#!/usr/bin/env bash
# Prints the path of NVIDIA's PTX assembler, ptxas, for internal/kernels'
# TestPTXAssembles (which also runs the nvdisasm beside it), fetching both
# first if needed: the nvidia-cuda-toolkit
# package of Debian 12's non-free component (CUDA 11.8, which assembles
# sm_70 up to sm_90), downloaded with apt-get into a cache and unpacked
# there, without installing it or changing the system's apt sources. No GPU
# or driver is needed. Usage: GCCL_PTXAS=$(.ci/ptxas.sh)
set -euo pipefail
cache=${GCCL_CACHE:-$HOME/.cache/gccl}/ptxas
bin=$cache/usr/bin/ptxas
if [ -x "$bin" ] && [ -x "$cache/usr/bin/nvdisasm" ] && "$bin" --version >/dev/null 2>&1; then
	echo "$bin"
	exit 0
fi
mkdir -p "$cache/lists/partial" "$cache/deb"
cat >"$cache/sources.list" <<'SRC'
deb http://deb.debian.org/debian bookworm non-free
SRC
o=(-o APT::Sandbox::User=root -o "Dir::Etc::SourceList=$cache/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$cache/lists")
apt-get "${o[@]}" update -qq >&2
(cd "$cache/deb" && apt-get "${o[@]}" download -qq nvidia-cuda-toolkit >&2)
dpkg-deb --fsys-tarfile "$cache"/deb/nvidia-cuda-toolkit_*.deb | tar -C "$cache" -xf - ./usr/bin/ptxas ./usr/bin/nvdisasm
rm -rf "$cache/deb" "$cache/lists"
"$bin" --version >&2
echo "$bin"
