#!/usr/bin/env bash
# tests/perf_ab.sh: gccl-perf at two commits, side by side, alternating, so
# that a change can be shown not to slow the collectives down on a noisy
# machine (only same-run ratios mean anything there).
#
#   tests/perf_ab.sh BEFORE AFTER [ROUNDS] [-- GCCL-PERF ARGS]
#
# builds cmd/gccl-perf at each commit (git worktrees under a temporary
# directory), then for each test in $AB_TESTS (default: all_reduce
# all_gather broadcast) runs the two binaries ROUNDS times (default 5),
# alternating which goes first, with -np 2 and the given arguments (default
# -b 8 -e 16M -f 8 -n 50 -w 10 -z 1 -c 0), and prints, per size, the median
# out-of-place time of each and AFTER/BEFORE (below 1: AFTER is faster).
set -euo pipefail
before=${1:?usage: perf_ab.sh BEFORE AFTER [ROUNDS] [-- ARGS]}
after=${2:?usage: perf_ab.sh BEFORE AFTER [ROUNDS] [-- ARGS]}
shift 2
rounds=5
if [ $# -gt 0 ] && [ "$1" != -- ]; then rounds=$1; shift; fi
[ "${1:-}" = -- ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-b 8 -e 16M -f 8 -n 50 -w 10 -z 1 -c 0)
tests=${AB_TESTS:-all_reduce all_gather broadcast}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/a" >/dev/null 2>&1; git worktree remove --force "$tmp/b" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
for side in a b; do
	rev=$before
	[ $side = b ] && rev=$after
	git worktree add -q --detach "$tmp/$side" "$rev"
	(cd "$tmp/$side" && go build -o "$tmp/gp-$side" ./cmd/gccl-perf)
done
echo "before: $(git rev-parse --short "$before")  after: $(git rev-parse --short "$after")  rounds: $rounds  args: ${args[*]}"
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%F)"
for t in $tests; do
	for r in $(seq "$rounds"); do
		order="a b"
		[ $((r % 2)) -eq 0 ] && order="b a"
		for side in $order; do
			"$tmp/gp-$side" "$t" -np 2 "${args[@]}" | awk -v s=$side '
				/^#/ || NF < 6 { next }
				$1 ~ /^[0-9]+$/ { print s, $1, $6 }' >>"$tmp/$t.txt"
		done
	done
	echo
	echo "== $t, 2 ranks: median out-of-place time (us)"
	printf '%12s %12s %12s %8s\n' bytes before after after/before
	python3 - "$tmp/$t.txt" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    side, size, us = line.split()
    rows.setdefault(int(size), {}).setdefault(side, []).append(float(us))
for size in sorted(rows):
    a, b = statistics.median(rows[size]['a']), statistics.median(rows[size]['b'])
    print(f"{size:12d} {a:12.2f} {b:12.2f} {b / a:8.2f}")
PY
done
