#!/usr/bin/env bash
# tests/determ_cost.sh: what the deterministic path (GCCL_DETERMINISTIC=1)
# costs against the default path, measured in the same run, alternating.
#
#   tests/determ_cost.sh [ROUNDS] [-- GCCL-PERF ARGS]
#
# builds cmd/gccl-perf, then for each test in $DC_TESTS (default:
# all_reduce) and each rank count in $DC_NP (default: 2 4) runs it ROUNDS
# times (default 3) with GCCL_DETERMINISTIC=0 and =1, alternating which goes
# first, with the given arguments (default -b 8 -e 64M -f 8 -n 20 -w 5 -c 0),
# and prints, per size, the median out-of-place time of each and
# deterministic/default (above 1: the deterministic path is slower).
set -euo pipefail
rounds=3
if [ $# -gt 0 ] && [ "$1" != -- ]; then rounds=$1; shift; fi
[ "${1:-}" = -- ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-b 8 -e 64M -f 8 -n 20 -w 5 -c 0)
tests=${DC_TESTS:-all_reduce}
nps=${DC_NP:-2 4}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/gccl-perf" ./cmd/gccl-perf
echo "commit: $(git rev-parse --short HEAD)  rounds: $rounds  args: ${args[*]}"
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%F)"
echo "load before: $(uptime)"
for t in $tests; do
	for np in $nps; do
		for r in $(seq "$rounds"); do
			order="0 1"
			[ $((r % 2)) -eq 0 ] && order="1 0"
			for det in $order; do
				GCCL_DETERMINISTIC=$det "$tmp/gccl-perf" "$t" -np "$np" "${args[@]}" | awk -v s=$det '
					/^#/ || NF < 6 { next }
					$1 ~ /^[0-9]+$/ { print s, $1, $6 }' >>"$tmp/$t-$np.txt"
			done
		done
		echo
		echo "== $t, $np ranks: median out-of-place time (us)"
		printf '%12s %12s %12s %8s\n' bytes default determ determ/default
		python3 - "$tmp/$t-$np.txt" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    side, size, us = line.split()
    rows.setdefault(int(size), {}).setdefault(side, []).append(float(us))
for size in sorted(rows):
    a, b = statistics.median(rows[size]['0']), statistics.median(rows[size]['1'])
    print(f"{size:12d} {a:12.2f} {b:12.2f} {b / a:8.2f}")
PY
	done
done
echo
echo "load after: $(uptime)"
