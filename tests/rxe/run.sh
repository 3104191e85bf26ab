#!/usr/bin/env bash
# tests/rxe/run.sh: gccl's RDMA tests against the real rdma-core and
# kernel verbs stack, on Soft-RoCE (rdma_rxe) in qemu VMs, from a clean
# clone, as root (it apt-gets what it lacks; downloads are cached under
# /var/tmp/gccl-rxe). The command CI runs:
#
#   tests/rxe/run.sh [--no-2vm] [PKG...]
#
# Default PKGs, each with the tests it runs in one VM and in two:
#   ./internal/verbs     one VM: all; two VMs: ^TestTwoHosts$
#   ./transport/ibverbs  one VM: all; two VMs: ^TestTwoHosts$
#   ./tests/ib           one VM: all (multi-process jobs over the ibverbs
#                        transport); two VMs: ^TestTwoHosts$
#   ./p2p                one VM: ^TestRDMA (the rdma backend, cancel, stall,
#                        a killed target); two VMs: none
#   ./examples/disagg    one VM: ^TestDisaggRDMA$; two VMs:
#                        ^TestDisaggTwoHosts$ (prefill and decode hosts)
# Another package: all of its tests in one VM, ^TestTwoHosts$ in two.
# RXE_1VM_RUN, when set, is the -test.run pattern of step 2 for every
# package; RXE_2VM_RUN that of step 3.
#
# 1. on the host: go test PKG (the pure tests, and internal/verbs' layout
#    check against rdma-core's verbs.h; the device tests skip there);
# 2. each PKG's test binary, built here, runs in one VM with rxe0 set up
#    and GCCL_TEST_REQUIRE_RDMA=1 (a test that finds no device fails);
#    $RXE_1VM_RUN, when set, picks the tests (-test.run) while iterating;
# 3. unless --no-2vm: two VMs joined by a virtual wire, each with its own
#    rxe0, run each binary's tests matching $RXE_2VM_RUN (default
#    ^TestTwoHosts$) as ranks 0 and 1; they must pass, not skip.
# The programs the multi-process tests start (gccl-run, collcheck,
# gccl-perf) are built here once and found in the VMs through
# GCCL_TEST_BIN_DIR: building them in the emulated guest takes minutes.
# Each step's time is printed; the exit status is 0 only if all passed.
# tests/rxe/README.md says more; tests/rxe/vm.sh --help lists its knobs.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"
export GOFLAGS="${GOFLAGS:-} -count=1"

two=1
if [ "${1:-}" = --no-2vm ]; then two=0; shift; fi
pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=(./internal/verbs ./transport/ibverbs ./tests/ib ./p2p ./examples/disagg)
# patterns PKG: sets run1 (one VM's -test.run, empty: all) and run2 (two
# VMs', empty: no two-VM step).
patterns() {
	case "${1#./}" in
	p2p) run1='^TestRDMA' run2='' ;;
	examples/disagg) run1='^TestDisaggRDMA$' run2='^TestDisaggTwoHosts$' ;;
	*) run1='' run2='^TestTwoHosts$' ;;
	esac
	run1=${RXE_1VM_RUN:-$run1}
	run2=${RXE_2VM_RUN:-$run2}
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}'; }
times=()
step() { echo; echo "=== rxe: $*"; }
took() { times+=("$(printf '%-46s %6ss' "$1" "$(since "$2")")"); }
fail=0
T0=$(now)

command -v go >/dev/null || { echo "rxe: Go is not installed (gccl needs the go.mod's version)"; exit 1; }
# The layout check compiles against verbs.h; the VM's own packages are
# vm.sh's business.
need=()
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
command -v cc >/dev/null || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
	[ "$(id -u)" = 0 ] || { echo "rxe: need root to apt-get install ${need[*]}"; exit 1; }
	t=$(now)
	echo "rxe: installing ${need[*]}"
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	took "apt-get ${need[*]}" "$t"
fi

step "prepare the VM (kernel package, initramfs)"
t=$(now)
tests/rxe/vm.sh --prepare
took "prepare the VM" "$t"

work=$(mktemp -d /var/tmp/gccl-rxe-bin.XXXXXX)
trap 'rm -rf "$work"' EXIT

step "build the programs the tests start"
t=$(now)
mkdir -p "$work/bin"
go build -o "$work/bin/" ./cmd/gccl-run ./cmd/gccl-perf ./tests/collcheck
export GCCL_TEST_BIN_DIR=$work/bin
took "go build gccl-run gccl-perf collcheck" "$t"

for pkg in "${pkgs[@]}"; do
	name=$(echo "${pkg#./}" | tr / _)
	step "host: go test $pkg"
	t=$(now)
	if go test -v "$pkg" >"$work/$name.host" 2>&1; then
		grep -E '^(ok|--- SKIP)|facts of ibv_abi.h' "$work/$name.host" | sed 's/^/    /' || true
	else
		cat "$work/$name.host"
		fail=1
	fi
	took "host: go test $pkg" "$t"

	step "build the test binary of $pkg"
	t=$(now)
	go test -c -o "$work/$name.test" "$pkg"
	took "go test -c $pkg" "$t"
	dir=$(go list -f '{{.Dir}}' "$pkg")
	patterns "$pkg"
	onevm=()
	[ -z "$run1" ] || onevm=(-test.run "$run1")

	step "one VM: $pkg's tests on rxe0${run1:+ matching $run1}"
	t=$(now)
	out=$work/$name.vm
	if (cd "$dir" && GCCL_TEST_REQUIRE_RDMA=1 RXE_VM_ENV="GCCL_TEST_REQUIRE_RDMA GCCL_TEST_BIN_DIR" \
		"$root/tests/rxe/vm.sh" --setup -- "$work/$name.test" -test.v -test.timeout=900s ${onevm[@]+"${onevm[@]}"}) >"$out" 2>&1; then
		grep -E '^(== |--- |PASS|ok|rxe-vm:)|    [a-z_]+_test\.go:[0-9]+: (rank|woke|QP|verbs:|np=|memlock:|port down:|no RTR:|kill/|stop/|round|sleep=|peers saw|failed|.*NET/IB|cancel|the READ|the next request|MemAvailable)' "$out" | cut -c1-240 | sed 's/^/    /'
	else
		cat "$out"
		fail=1
	fi
	took "one VM: $pkg" "$t"

	if [ $two = 1 ] && [ -n "$run2" ]; then
		pattern=$run2
		step "two VMs: $pkg's tests matching $pattern"
		t=$(now)
		out=$work/$name.2vm
		if (cd "$dir" && "$root/tests/rxe/vm.sh" --two -- env GCCL_TEST_REQUIRE_RDMA=1 GCCL_TEST_BIN_DIR="$GCCL_TEST_BIN_DIR" \
			"$work/$name.test" -test.v -test.run "$pattern" -test.timeout=900s) >"$out" 2>&1 &&
			[ "$(grep -c -- '^--- PASS' "$out")" -ge 2 ] && ! grep -q -- '^--- SKIP' "$out"; then
			grep -E '^(#{8} |== |--- |PASS|ok|rxe-vm:)|_test\.go:[0-9]+: rank|^(decode|prefill): .*(RDMA|received and checked|over (rdma|tcp))' "$out" | cut -c1-240 | sed 's/^/    /'
		else
			cat "$out"
			echo "rxe: the two-VM tests failed, or skipped, or none ran"
			fail=1
		fi
		took "two VMs: $pkg" "$t"
	fi
done

echo
echo "=== rxe: timings (accel ${RXE_VM_ACCEL:-tcg}, $(nproc) host CPUs)"
printf '    %s\n' "${times[@]}"
printf '    %-46s %6ss\n' "total" "$(since "$T0")"
if [ $fail = 0 ]; then echo "rxe: all passed"; else echo "rxe: FAILED"; fi
exit $fail
