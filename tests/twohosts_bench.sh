#!/usr/bin/env bash
# Benchmark of the hierarchical all-reduce against the flat ring on two
# "hosts": network namespaces joined by a veth pair shaped with tc tbf, two
# ranks in each (shared memory inside, TCP across). Needs root and iproute2.
#
#   tests/twohosts_bench.sh [rate] [gccl-perf args...]
#   tests/twohosts_bench.sh 2gbit all_reduce -b 256K -e 64M -f 4 -n 5 -w 2
#
# Prints gccl-perf's table for the tuner's choice and for GCCL_ALGO=ring, or
# for each GCCL_ALGO value in $ALGOS ("default" for the tuner's choice).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-2gbit}
shift || true
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(all_reduce -b 256K -e 64M -f 4 -n 5 -w 2)

bin=$(mktemp -d)
trap 'ip netns del gbench_a 2>/dev/null; ip netns del gbench_b 2>/dev/null; rm -rf "$bin"' EXIT
go build -o "$bin/gccl-perf" ./cmd/gccl-perf
go build -o "$bin/gccl-run" ./cmd/gccl-run

ip netns add gbench_a
ip netns add gbench_b
ip link add gbv_a netns gbench_a type veth peer name gbv_b netns gbench_b
ip -n gbench_a addr add 10.251.0.1/24 dev gbv_a
ip -n gbench_b addr add 10.251.0.2/24 dev gbv_b
for s in a b; do
	ip -n gbench_$s link set gbv_$s up
	ip -n gbench_$s link set lo up
	ip netns exec gbench_$s tc qdisc add dev gbv_$s root tbf rate "$rate" burst 256kb latency 50ms
done

run() { # $1: GCCL_ALGO value
	local port=$((20000 + RANDOM % 20000)) secret
	secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
	for node in 1 0; do
		ip netns exec gbench_$([ $node = 0 ] && echo a || echo b) env GCCL_ALGO="$1" GCCL_SECRET="$secret" \
			GCCL_SOCKET_IFNAME=gbv "$bin/gccl-run" -np 2 --nnodes 2 --node-rank $node \
			--master-addr 10.251.0.1 --master-port $port "$bin/gccl-perf" "${args[@]}" &
	done
	wait
}
for algo in ${ALGOS:-default ring}; do
	echo "### link $rate, GCCL_ALGO=$algo"
	[ "$algo" = default ] && algo=""
	run "$algo" | grep -v '^\[rank [1-3]\]'
done
