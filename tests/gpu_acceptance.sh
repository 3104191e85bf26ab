#!/usr/bin/env bash
# Runs every GPU path of gccl on the GPU(s) of this machine, as issue "GPU
# memory" asks, and prints the figures for docs/HARDWARE.md and
# docs/PERFORMANCE.md. Needs the NVIDIA driver (libcuda.so.1) and Go; no CUDA
# toolkit. Usage, from the repository root:
#
#	tests/gpu_acceptance.sh [outdir]
#
# Steps (each prints "=== step"):
#  1. the driver binding, the engine's kernels (every type and op, from the
#     embedded PTX) and stream holds, the gpu package's collectives (stream
#     ordering included), on the real driver;
#  2. devcheck across 2 and 4 processes (every type and op, float64
#     reference, on the devices through CUDA IPC), and across 2 with every
#     call async on a stream (-stream);
#  3. device all-reduce of 256 MiB between 2 processes against a
#     device-to-device copy in the same run (target: >= 70%);
#  3b. gccl-perf all_reduce and all_gather on device buffers (-M device), for
#     comparison with nccl-tests' figures on the same machine;
#  4. the sum kernel in place for float32 and bfloat16 (compare with torch's
#     add_ when python3 has torch: target within 10%);
#  5. the p2p agent: host<->device against a raw pinned copy in the same run
#     (target: >= 90%), and VRAM to another process's VRAM over cudaipc.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/gccl-gpu}
mkdir -p "$out"
export GCCL_TEST_REAL_GPU=1 GOFLAGS="${GOFLAGS:-} -count=1"
fail=0
step() { echo; echo "=== $*"; }
check() { "$@" || { echo "FAILED: $*"; fail=1; }; }

nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
go version

step "1. driver binding, kernels, gpu collectives on the real driver"
check go test -v -run 'TestExportImport|TestReduceEveryKernel|Hold' ./transport/nvlink
check go test -v ./gpu

step "2. devcheck, 2 and 4 processes"
go build -o "$out/gccl-run" ./cmd/gccl-run && go build -o "$out/devcheck" ./tests/devcheck || exit 1
for np in 2 4; do
	check "$out/gccl-run" -np $np "$out/devcheck" -count 1000003
done
check "$out/gccl-run" -np 2 "$out/devcheck" -count 1000003 -stream

step "3. device all-reduce 256 MiB vs device-to-device copy, 2 processes"
check "$out/gccl-run" -np 2 "$out/devcheck" -count 1031 -bench -bench-bytes $((256 << 20)) -bench-iters 20

step "3b. gccl-perf on device buffers (nccl-tests' table), 2 processes"
go build -o "$out/gccl-perf" ./cmd/gccl-perf || exit 1
check "$out/gccl-run" -np 2 "$out/gccl-perf" all_reduce -M device -b 8 -e 256M -f 4 -c 1 -w 5 -n 20 -J "$out/perf-device.json"
check "$out/gccl-run" -np 2 "$out/gccl-perf" all_gather -M device -b 8 -e 256M -f 4 -c 1 -w 5 -n 20

step "4. sum kernel in place (float32, bfloat16), 256 MiB"
check go test -run '^$' -bench BenchmarkSumInPlace -benchtime 50x ./transport/nvlink
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
	python3 - <<'PY'
import torch
for dt in (torch.float32, torch.bfloat16):
    n = (256 << 20) // torch.tensor([], dtype=dt).element_size()
    a = torch.ones(n, dtype=dt, device="cuda"); b = torch.ones(n, dtype=dt, device="cuda")
    for _ in range(5): a.add_(b)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(50): a.add_(b)
    e.record(); torch.cuda.synchronize()
    t = s.elapsed_time(e) / 50 / 1e3
    print(f"torch add_ {dt}: {3 * (256 << 20) / t / 1e6:.1f} MB/s (same bytes as BenchmarkSumInPlace)")
PY
else
	echo "(no torch with CUDA: compare BenchmarkSumInPlace with a torch a.add_(b) of 256 MiB by hand)"
fi

step "5. p2p agent: host<->device and cudaipc"
check go run ./cmd/gccl-p2pbench -gpu -dev 0 -b 1M -e 256M -f 4 -n 20 -w 3

echo
if [ $fail = 0 ]; then echo "gpu acceptance: all steps passed"; else echo "gpu acceptance: some steps FAILED"; fi
exit $fail
