#!/usr/bin/env bash
# tests/rxe/perf.sh: gccl over the ibverbs transport against perftest on
# the same Soft-RoCE device, in one rxe VM (tests/rxe/vm.sh --setup):
#
#   tests/rxe/perf.sh [ROUNDS]        (default 3)
#
# Each round runs, back to back on rxe0 (every process of the VM, so
# through rxe's loopback), in pairs that move data the same way:
#   ib_write_bw    -s 4M  and  gccl-perf broadcast  -np 2 -b 4M
#                                   one direction (rank 0 to rank 1)
#   ib_write_bw -b -s 4M  and  gccl-perf sendrecv   -np 2 -b 4M
#                                   both directions at once (rank r sends
#                                   to r+1 and receives from r-1)
#                         and  gccl-perf all_reduce -np 2 -b 4M
#                                   (a ring of 2: 4 MiB each way per op,
#                                   and the reduction)
#   ib_send_lat -s 8      and  gccl-perf sendrecv -np 2 -b 8
# with GCCL_SHM_DISABLE=1 (the two ranks are on one host). Soft-RoCE does
# its work on the VM's CPUs, under emulation, so only the ratios mean
# anything, and they move with the host's load: rounds alternate, and the
# medians are compared. Needs what vm.sh needs, plus perftest (apt-get).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"
rounds=${1:-3}
if ! command -v ib_write_bw >/dev/null; then
	[ "$(id -u)" = 0 ] || { echo "perf: need root to apt-get install perftest"; exit 1; }
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends perftest >/dev/null
fi
work=$(mktemp -d /var/tmp/gccl-rxe-perf.XXXXXX)
trap 'rm -rf "$work"' EXIT
go build -o "$work/gccl-perf" ./cmd/gccl-perf
cat >"$work/guest.sh" <<'EOF'
set -u
cd "$(dirname "$0")"
G=$RXEVM_GIDX
rounds=$1
out=/tmp/perf
mkdir -p $out
# Every step runs under a time limit (rxe under emulation has soft-locked
# a vCPU for tens of seconds), and says how long it took; a step that
# fails or times out leaves no figure and is reported.
step_t0() { t0=$(date +%s); }
step_end() { echo "   $1: rc $2, $(($(date +%s) - t0)) s: $3"; }
perftest() { # NAME ARGS...: server and client of a perftest binary on rxe0
	name=$1; shift
	step_t0
	timeout 180 "$@" -d rxe0 -x "$G" >/dev/null 2>&1 &
	server=$!
	# The client retries while the server is not listening yet (its
	# start under emulation may take seconds).
	rc=1
	for try in 1 2 3 4 5 6 7 8 9 10; do
		sleep 2
		if timeout 180 "$@" -d rxe0 -x "$G" 127.0.0.1 >"$out/$name.try" 2>&1; then
			rc=0
			cat "$out/$name.try" >>"$out/$name"
			break
		fi
		kill -0 $server 2>/dev/null || break
	done
	wait $server
	step_end "$name ($*)" $rc "$(awk '$1 == 4194304 || $1 == 8 {print}' "$out/$name.try" | tail -1)"
}
gccl() { # NAME TEST SIZE ITERS
	step_t0
	GCCL_SHM_DISABLE=1 GCCL_DEBUG=WARN timeout -s QUIT -k 10 180 ./gccl-perf "$2" -np 2 -b "$3" -e "$3" -n "$4" -w 1 >"$out/$1.try" 2>&1
	rc=$?
	awk '$1 ~ /^[0-9]+$/ {print $6, $10}' "$out/$1.try" >>"$out/$1"
	[ $rc = 0 ] || tail -20 "$out/$1.try"
	step_end "$1 (gccl-perf $2 $3)" $rc "$(awk '$1 ~ /^[0-9]+$/ {print $6, $10 " us"}' "$out/$1.try")"
}
header_done=
for r in $(seq 1 "$rounds"); do
	echo "== round $r $(date -u +%T)"
	perftest bw1 ib_write_bw -s 4194304 -n 20
	gccl bc4m broadcast 4M 6
	gccl sr4m sendrecv 4M 6
	perftest bw2 ib_write_bw -b -s 4194304 -n 20
	gccl ar4m all_reduce 4M 6
	perftest lat ib_send_lat -s 8 -n 500
	gccl sr8 sendrecv 8 100
	if [ -z "$header_done" ]; then
		GCCL_SHM_DISABLE=1 GCCL_DEBUG=WARN timeout -k 10 180 ./gccl-perf sendrecv -np 2 -b 8 -e 8 -n 1 -w 1 2>/dev/null | grep -E '^#  (Rank|Transports)'
		header_done=1
	fi
done
# perftest's table rows: ib_write_bw "#bytes #iters peak avg msgrate" (MB/s),
# ib_send_lat "#bytes #iters t_min t_max t_typical ..." (usec).
med() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
bw1=$(awk '$1 == 4194304 {print $4}' $out/bw1 | med)
bw2=$(awk '$1 == 4194304 {print $4}' $out/bw2 | med)
lat=$(awk '$1 == 8 {print $5}' $out/lat | med)
bc=$( { awk '{print $1}' $out/bc4m; awk '{print $2}' $out/bc4m; } | med)
sr=$( { awk '{print $1}' $out/sr4m; awk '{print $2}' $out/sr4m; } | med)
ar=$( { awk '{print $1}' $out/ar4m; awk '{print $2}' $out/ar4m; } | med)
sr8=$( { awk '{print $1}' $out/sr8; awk '{print $2}' $out/sr8; } | med)
echo
echo "raw: ib_write_bw $(awk '$1 == 4194304 {printf "%s ", $4}' $out/bw1)MB/s; -b $(awk '$1 == 4194304 {printf "%s ", $4}' $out/bw2)MB/s;" \
	"broadcast 4M $(tr '\n' ' ' <$out/bc4m)us; sendrecv 4M $(tr '\n' ' ' <$out/sr4m)us; all_reduce 4M $(tr '\n' ' ' <$out/ar4m)us;" \
	"ib_send_lat $(awk '$1 == 8 {printf "%s ", $5}' $out/lat)us; sendrecv 8B $(tr '\n' ' ' <$out/sr8)us"
awk -v bw1="$bw1" -v bw2="$bw2" -v lat="$lat" -v bc="$bc" -v sr="$sr" -v ar="$ar" -v sr8="$sr8" 'BEGIN {
	mb = 4194304 / 1e6
	bcbw = mb / (bc / 1e6); srbw = mb / (sr / 1e6); arbw = mb / (ar / 1e6)
	printf "\nmedians over the rounds (MB/s = 10^6 bytes/s; per direction):\n"
	printf "  one direction:\n"
	printf "    ib_write_bw                     %8.2f MB/s\n", bw1
	printf "    gccl broadcast 4 MiB            %8.2f MB/s  (%.0f us)  %3.0f%% of ib_write_bw\n", bcbw, bc, 100 * bcbw / bw1
	printf "  both directions at once:\n"
	printf "    ib_write_bw -b, each way        %8.2f MB/s  (%.2f both)\n", bw2 / 2, bw2
	printf "    gccl sendrecv 4 MiB, each way   %8.2f MB/s  (%.0f us)  %3.0f%% of ib_write_bw -b (%3.0f%% of ib_write_bw one way)\n", srbw, sr, 100 * srbw / (bw2 / 2), 100 * srbw / bw1
	printf "    gccl all_reduce 4 MiB, busbw    %8.2f MB/s  (%.0f us)  %3.0f%% of ib_write_bw -b (%3.0f%% of ib_write_bw one way)\n", arbw, ar, 100 * arbw / (bw2 / 2), 100 * arbw / bw1
	printf "  latency:\n"
	printf "    ib_send_lat 8 B, typical        %8.1f us\n", lat
	printf "    gccl sendrecv 8 B               %8.1f us  (%.1fx ib_send_lat)\n", sr8, sr8 / lat
}'
EOF
RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-3600} tests/rxe/vm.sh --setup -- sh "$work/guest.sh" "$rounds"
