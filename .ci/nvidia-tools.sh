#!/usr/bin/env bash
# Fetches NVIDIA's tools and driver library that some tests check gccl
# against without a GPU, and prints the shell exports that point the tests
# at them:
#
#	eval "$(.ci/nvidia-tools.sh)"
#
#  - GCCL_PTXAS: ptxas (and nvdisasm beside it) of CUDA 11.8, which
#    assemble sm_70 up to sm_90 (internal/kernels TestPTXAssembles), from
#    the nvidia-cuda-toolkit package;
#  - GCCL_TEST_DRIVER_LIBRARY: the driver library libcuda.so.1, whose entry
#    points and result names gccl declares (internal/cuda
#    TestInstalledDriverLibrary), from the libcuda1 package;
#  - GCCL_TEST_NVML_LIBRARY: libnvidia-ml.so.1, which topo loads through
#    internal/nvml (its TestInstalledLibrary, topo TestInstalledNVMLLibrary),
#    from libnvidia-ml1.
#
# Both come from Debian 12's non-free component, downloaded with apt-get
# into a cache and unpacked there, without installing them or changing the
# system's apt sources.
set -euo pipefail
cache=${GCCL_CACHE:-$HOME/.cache/gccl}/nvidia
ptxas=$cache/usr/bin/ptxas
libcuda=$cache/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1
libnvml=$cache/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1
if ! { [ -x "$ptxas" ] && [ -x "$cache/usr/bin/nvdisasm" ] && [ -e "$libcuda" ] && [ -e "$libnvml" ]; }; then
	mkdir -p "$cache/lists/partial" "$cache/deb"
	echo "deb http://deb.debian.org/debian bookworm non-free" >"$cache/sources.list"
	o=(-o APT::Sandbox::User=root -o "Dir::Etc::SourceList=$cache/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$cache/lists")
	apt-get "${o[@]}" update -qq >&2
	(cd "$cache/deb" && apt-get "${o[@]}" download -qq nvidia-cuda-toolkit libcuda1 libnvidia-ml1 >&2)
	dpkg-deb --fsys-tarfile "$cache"/deb/nvidia-cuda-toolkit_*.deb | tar -C "$cache" -xf - ./usr/bin/ptxas ./usr/bin/nvdisasm
	dpkg-deb -x "$cache"/deb/libcuda1_*.deb "$cache"
	dpkg-deb -x "$cache"/deb/libnvidia-ml1_*.deb "$cache"
	rm -rf "$cache/deb" "$cache/lists"
fi
"$ptxas" --version | tail -n 1 >&2
echo "export GCCL_PTXAS=$ptxas GCCL_TEST_DRIVER_LIBRARY=$libcuda GCCL_TEST_NVML_LIBRARY=$libnvml"
