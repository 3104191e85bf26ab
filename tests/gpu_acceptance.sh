#!/usr/bin/env bash
# Runs every GPU path of gccl on the GPU(s) of this machine, as issue "GPU
# memory" asks, and prints the figures for docs/HARDWARE.md and
# docs/PERFORMANCE.md. Needs the NVIDIA driver (libcuda.so.1), and Go with
# gcc unless -b gives binaries built elsewhere; no CUDA toolkit. Usage, from
# the repository root:
#
#	tests/gpu_acceptance.sh [-b BUNDLE] [-s "STEPS"] [-rehearse] [OUTDIR]
#
#  -b BUNDLE  run the binaries of BUNDLE (tests/gpu_bundle.sh: a tar.xz, or
#             the directory of its -d) instead of building them with Go;
#  -s STEPS   run only these steps (default: "1 2 2b 3 3b 4 5 6");
#  -rehearse  run on the fake driver (internal/cuda/testdata/fakecuda.c,
#             built with gcc and loaded as libcuda.so.1, one device) and the
#             fake libcufile, at smaller sizes: it checks this script and
#             the binaries on a machine without a GPU; its figures mean
#             nothing.
#
# OUTDIR (default /tmp/gccl-gpu) receives the JSON of step 3b and the
# cuFile log; the binaries go to a temporary directory, not OUTDIR.
#
# Steps (each prints "=== step"; a summary of all ends the output):
#  1. the engine's descriptions, kernels (every type and op, from the
#     embedded PTX; their loading timed without the JIT cache and with it)
#     and stream holds, and the gpu package's collectives (stream
#     ordering included), on the real driver;
#  2. devcheck across 2 and 4 processes (every type and op, float64
#     reference, on the devices through CUDA IPC; send/recv device to
#     device), and across 2 with every call async on a stream (-stream);
#  2b. the same on views of a registered device window (-stream -window:
#     stream-ordered, the devices waiting on flags), and the latency of
#     all-reduce and all-gather from 8 B to 64 KiB, the stream held per
#     call against stream-ordered (-latency; issue 27's target: at most
#     25 us on an H100); on a one-GPU machine, the WARN that two
#     processes time-slice the GPU, and with MPS installed the latency
#     again under MPS;
#  3. device all-reduce of 256 MiB between 2 processes against a
#     device-to-device copy in the same run, timed by each rank alone and
#     by both at once (target: >= 70%; on one GPU at most 50% of the lone
#     copy, docs/PERFORMANCE.md);
#  3b. gccl-perf all_reduce and all_gather on device buffers (-M device), for
#     comparison with nccl-tests' figures on the same machine, and 8 B to
#     64 KiB of both on registered windows (-R 2: stream-ordered; under
#     MPS too, as in 2b);
#  4. the sum kernel in place for float32 and bfloat16, beside a
#     device-to-device copy of the same buffers (compare with torch's add_
#     when python3 has torch: target within 10%);
#  5. the p2p agent: host<->device against a raw pinned copy in the same run
#     (target: >= 90%), and VRAM to another process's VRAM over cudaipc;
#  6. cuFile (GPUDirect Storage, or its compatibility mode without
#     nvidia-fs): the binding and the agent's VRAM<->FILE with GDS on and
#     off, on the installed libcufile (or the one in python3's nvidia-cufile
#     package).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

bundle= steps="1 2 2b 3 3b 4 5 6" rehearse=0
while [ $# -gt 0 ]; do
	case $1 in
	-b) bundle=$2; shift 2 ;;
	-s) steps=$2; shift 2 ;;
	-rehearse) rehearse=1; shift ;;
	-*) echo "usage: $0 [-b BUNDLE] [-s STEPS] [-rehearse] [OUTDIR]" >&2; exit 2 ;;
	*) break ;;
	esac
done
for s in $steps; do
	case " 1 2 2b 3 3b 4 5 6 " in
	*" $s "*) ;;
	*) echo "$0: no step $s (the steps are 1 2 3 3b 4 5 6)" >&2; exit 2 ;;
	esac
done
out=${1:-/tmp/gccl-gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=$work/bin
export GCCL_TEST_REAL_GPU=1

# Sizes: the issue's on a GPU; smaller in a rehearsal, where the fake
# driver's kernels run on the CPU.
count=1000003 big=$((256 << 20)) bigh=256M iters=20 sumx=50x
if [ $rehearse = 1 ]; then
	count=100003 big=$((16 << 20)) bigh=16M iters=3 sumx=2x
fi

failed=() passed=()
check_timeout=${GCCL_CHECK_TIMEOUT:-270}
step() { echo; echo "=== $*"; }
# expect N PATTERN CMD... runs CMD..., which must succeed and print N
# lines matching PATTERN (a test or benchmark that ran, not one filtered
# out or skipped; every rank's report).
expect() {
	local n=$1 pat=$2; shift 2
	echo "+ $*"
	local log=$work/expect.log
	# A hang fails its check, not the whole run (a lent GPU's time is short).
	# (Through bash -c, since timeout cannot run the function gotest.)
	timeout -k 10 "$check_timeout" bash -c '"$@"' bash "$@" 2>&1 | tee "$log"
	local rc=${PIPESTATUS[0]} got
	[ "$rc" = 124 ] && echo "TIMED OUT after ${check_timeout}s"
	got=$(grep -cE -- "$pat" "$log")
	if [ "$rc" = 0 ] && [ "$got" -ge "$n" ]; then passed+=("$cur: $*"); return; fi
	[ "$rc" = 0 ] && echo "FAILED: $* printed $got lines matching '$pat', want $n" || echo "FAILED: $*"
	failed+=("$cur: $*")
}
wanted() { [[ " $steps " == *" $1 "* ]]; }
# gotest PKG ARGS runs PKG's test binary in PKG's directory, where its
# testdata is.
# -test.timeout ends a hung test before the check's timeout does, with a
# dump of every goroutine.
gotest() { local pkg=$1; shift; (cd "$root/$pkg" && "$bin/$(basename "$pkg").test" -test.count=1 -test.timeout=$((check_timeout - 30))s "$@"); }
export -f gotest
export root bin check_timeout

if [ -n "$bundle" ]; then
	mkdir -p "$bin"
	if [ -d "$bundle" ]; then
		cp -r "$bundle"/. "$bin"/
	else
		unxz() { if command -v xz >/dev/null; then xz -dc "$1"; else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"; fi; }
		unxz "$bundle" | tar -C "$bin" -xf - || { echo "cannot unpack $bundle"; exit 1; }
	fi
	echo "binaries from $bundle, commit $(cat "$bin/COMMIT" 2>/dev/null | tr '\n' ' ')"
else
	tests/gpu_bundle.sh -d "$bin" || { echo "building the binaries failed"; exit 1; }
fi

if [ $rehearse = 1 ]; then
	echo "REHEARSAL on the fake driver: the results check the script, the figures mean nothing"
	fake=$work/fakelib
	mkdir -p "$fake"
	gcc -shared -fPIC -O2 -I internal/kernels -DGCCL_HOSTEMU -o "$fake/libcuda.so.1" internal/cuda/testdata/fakecuda.c -ldl &&
		gcc -shared -fPIC -O2 -o "$fake/libcufile.so.0" internal/cufile/testdata/fakecufile.c -ldl ||
		{ echo "building the fake libraries failed"; exit 1; }
	export LD_LIBRARY_PATH=$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} FAKECUDA_DEVICES=1
else
	nvidia-smi 2>/dev/null || echo "(no nvidia-smi)"
fi
uname -a
command -v go >/dev/null && go version

cur=1
if wanted 1; then
	step "1. engine, kernels, holds, gpu collectives on the driver"
	# Without the driver's JIT cache, TestFirstEngineLoadsTheKernels times
	# the compilation of every kernel, as in a fresh container; then twice
	# with the cache, which the first run fills.
	export CUDA_CACHE_DISABLE=1
	expect 1 '^--- PASS: TestReduceEveryKernel' gotest gpu/internal/engine -test.v -test.run 'TestExportImport|TestFirstEngineLoadsTheKernels|TestReduceEveryKernel|Hold'
	unset CUDA_CACHE_DISABLE
	expect 2 '^--- PASS: TestFirstEngineLoadsTheKernels' gotest gpu/internal/engine -test.v -test.run 'TestFirstEngineLoadsTheKernels' -test.count=2
	expect 1 '^--- PASS: TestCollectivesOnDeviceBuffers' gotest gpu -test.v
fi

cur=2
if wanted 2; then
	step "2. devcheck, 2 and 4 processes"
	direct='ok .* on the devices: true; send/recv direct: true'
	for np in 2 4; do
		expect $np "$direct" "$bin/gccl-run" -np $np "$bin/devcheck" -count $count
	done
	expect 2 "$direct; on a stream: true" "$bin/gccl-run" -np 2 "$bin/devcheck" -count $count -stream
fi

# Two processes on one GPU time-slice it unless NVIDIA's MPS serves them
# one context (docs/PERFORMANCE.md, "Stream-ordered calls"): on a one-GPU
# machine with MPS installed, the small-size figures are taken both ways.
gpus=1 mps=0
if [ $rehearse = 0 ]; then
	gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
	if [ "$gpus" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null; then
		mps=1
	fi
fi
# under_mps CMD... runs CMD with an MPS control daemon of its own.
under_mps() {
	export CUDA_MPS_PIPE_DIRECTORY=$work/mps CUDA_MPS_LOG_DIRECTORY=$work/mpslog
	mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
	nvidia-cuda-mps-control -d || { echo "starting MPS failed"; return 1; }
	"$@"
	local rc=$?
	echo quit | nvidia-cuda-mps-control
	sleep 1
	unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
	return $rc
}
export -f under_mps
export work

cur=2b
if wanted 2b; then
	step "2b. stream-ordered calls on device windows: checks, then small-size latency, 2 processes"
	expect 2 "on a stream: true; stream-ordered: true" "$bin/gccl-run" -np 2 "$bin/devcheck" -count $count -stream -window
	if [ "$gpus" = 1 ]; then
		echo "(one GPU, two processes, no MPS: each rank must warn that the GPU time-slices them)"
		expect 2 'without MPS: the GPU time-slices' "$bin/gccl-run" -np 2 "$bin/devcheck" -count 1031
	fi
	expect 20 'latency all_(reduce|gather) [0-9]+ B: stream held .* stream-ordered' "$bin/gccl-run" -np 2 "$bin/devcheck" -count 1031 -latency -bench-iters $((iters * 50))
	if [ $mps = 1 ]; then
		echo "(one GPU: the same under MPS)"
		expect 20 'latency all_(reduce|gather) [0-9]+ B: stream held .* stream-ordered' under_mps "$bin/gccl-run" -np 2 "$bin/devcheck" -count 1031 -latency -bench-iters $((iters * 50))
	fi
fi

cur=3
if wanted 3; then
	step "3. device all-reduce of $bigh vs device-to-device copy, 2 processes"
	expect 2 'busbw .* of the copy alone' "$bin/gccl-run" -np 2 "$bin/devcheck" -count 1031 -bench -bench-bytes $big -bench-iters $iters
fi

cur=3b
if wanted 3b; then
	step "3b. gccl-perf on device buffers (nccl-tests' table), 2 processes"
	ok='Out of bounds values : 0 OK'
	expect 1 "$ok" "$bin/gccl-run" -np 2 "$bin/gccl-perf" all_reduce -M device -b 8 -e $bigh -f 4 -c 1 -w 5 -n $iters -J "$out/perf-device.json"
	expect 1 "$ok" "$bin/gccl-run" -np 2 "$bin/gccl-perf" all_gather -M device -b 8 -e $bigh -f 4 -c 1 -w 5 -n $iters
	# Stream-ordered on registered windows (-R 2), the small sizes of issue 27.
	for c in all_reduce all_gather; do
		expect 1 "$ok" "$bin/gccl-run" -np 2 "$bin/gccl-perf" $c -M device -R 2 -b 8 -e 64K -f 2 -c 1 -w 5 -n $((iters * 50))
		if [ $mps = 1 ]; then
			expect 1 "$ok" under_mps "$bin/gccl-run" -np 2 "$bin/gccl-perf" $c -M device -R 2 -b 8 -e 64K -f 2 -c 1 -w 5 -n $((iters * 50))
		fi
	done
fi

cur=4
if wanted 4; then
	step "4. sum kernel in place (float32, bfloat16), 256 MiB"
	expect 3 '^BenchmarkSumInPlace/(copy|float32|bfloat16)' gotest gpu/internal/engine -test.run '^$' -test.bench BenchmarkSumInPlace -test.benchtime $sumx
	# Each kernel's bandwidth beside the device-to-device copy's, timed in
	# the same run: what memory allows a kernel streaming through it.
	awk '$1 ~ /^BenchmarkSumInPlace\// && $NF == "MB/s" { split($1, n, "[/-]"); bw[n[2]] = $(NF-1) }
		END { for (k in bw) if (k != "copy" && bw["copy"] > 0) printf "sum kernel %s: %.0f MB/s, %.0f%% of the copy (%.0f MB/s)\n", k, bw[k], 100 * bw[k] / bw["copy"], bw["copy"] }' "$work/expect.log"
	if [ $rehearse = 0 ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
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
fi

cur=5
if wanted 5; then
	step "5. p2p agent: host<->device and cudaipc"
	# The largest size's row, its VRAM->VRAM over CUDA IPC.
	expect 1 "^ *$big .* cudaipc\$" "$bin/gccl-p2pbench" -gpu -dev 0 -b 1M -e $bigh -f 4 -n $iters -w 3
fi

cur=6
if wanted 6; then
	step "6. cuFile: the binding, and the agent's VRAM<->FILE with GDS on and off"
	if [ $rehearse = 0 ] && [ -z "${GCCL_CUFILE_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcufile\.so\.0'; then
		# PyTorch's CUDA wheels bring libcufile in the nvidia-cufile package.
		lib=$(python3 -c 'import nvidia.cufile as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
		if [ -n "$lib" ] && [ -e "$lib/libcufile.so.0" ]; then
			export GCCL_CUFILE_LIBRARY=$lib/libcufile.so.0
		fi
	fi
	echo "libcufile: ${GCCL_CUFILE_LIBRARY:-libcufile.so.0, found by the dynamic loader}"
	lsmod 2>/dev/null | grep -q '^nvidia_fs' && echo "nvidia-fs is loaded: GDS proper" ||
		echo "nvidia-fs is not loaded: cuFile runs in its compatibility mode (POSIX I/O through bounce buffers)"
	# Compatibility mode allowed, the library's log in OUTDIR.
	printf '{"logging": {"dir": "%s", "level": "ERROR"}, "properties": {"allow_compat_mode": true}}\n' "$out" >"$out/cufile.json"
	export CUFILE_ENV_PATH_JSON=$out/cufile.json
	expect 1 '^--- (PASS|SKIP): TestReadWrite' gotest internal/cufile -test.v -test.run 'TestReadWrite$'
	expect 1 '^--- PASS: TestVRAMFile' gotest p2p -test.v -test.run 'TestVRAMFile$'
	# cuFile names its logs cufile_PID_DATE.TIME.log; one file, with a
	# name any copy takes, is easier to carry away.
	for f in "$out"/cufile_*.log; do
		[ -e "$f" ] && { echo "== $(basename "$f")"; cat "$f"; rm -f "$f"; }
	done >>"$out/cufile-log.txt"
fi

echo
echo "=== summary"
for p in "${passed[@]}"; do echo "passed  $p"; done
for f in "${failed[@]}"; do echo "FAILED  $f"; done
if [ ${#failed[@]} = 0 ]; then echo "gpu acceptance: all steps passed"; else echo "gpu acceptance: ${#failed[@]} checks FAILED"; fi
[ ${#failed[@]} = 0 ]
