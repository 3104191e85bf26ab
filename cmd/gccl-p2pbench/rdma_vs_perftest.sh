#!/bin/sh
# rdma_vs_perftest.sh P2PBENCH [SIZES...]: gccl-p2pbench's rdma WRITE and
# READ against perftest's ib_write_bw and ib_read_bw on the same RDMA device,
# alternating the two tools size by size, and the ratio of each pair. Run
# it where the device is, e.g. in the Soft-RoCE VM:
#
#   go build -o /tmp/p2pbench ./cmd/gccl-p2pbench
#   tests/rxe/vm.sh --setup -- cmd/gccl-p2pbench/rdma_vs_perftest.sh /tmp/p2pbench
#
# RDMA_DEV (default rxe0), RDMA_GIDX (default $RXEVM_GIDX), RDMA_ITERS
# (perftest's messages per QP, default: as many as make the bytes gccl
# moves, 32 MiB per QP, at least 5: perftest refuses fewer), RDMA_GCCL_ITERS (gccl's requests of
# ~32 MiB, default 4), RDMA_ROUNDS (pairs per size, default 1) and RDMA_QPS
# (perftest's QPs, default 4: gccl stripes a request over 4) tune it. Both
# report decimal Gb/s here; the last lines are each size's median ratio.
set -eu
bench=$1
shift
sizes=${*:-1048576 4194304 16777216}
dev=${RDMA_DEV:-rxe0}
gidx=${RDMA_GIDX:-${RXEVM_GIDX:-0}}
gccl_iters=${RDMA_GCCL_ITERS:-4} # gccl's requests (of ~32 MiB) per run
qps=${RDMA_QPS:-4}
port=18515

perftest() { # tool size -> Gb/s (BW average)
	port=$((port + 1))
	iters=${RDMA_ITERS:-$(( (32 << 20) / $2 ))}
	[ "$iters" -ge 5 ] || iters=5 # perftest refuses fewer than 5
	timeout 900 "$1" -d "$dev" -x "$gidx" -s "$2" -n "$iters" -q "$qps" -F --report_gbits -p "$port" >/tmp/pt.srv 2>&1 &
	srv=$!
	# The server listens a while after it starts (seconds in the emulated
	# VM): the client tries again until it connects.
	tries=0
	while :; do
		sleep 1
		if "$1" -d "$dev" -x "$gidx" -s "$2" -n "$iters" -q "$qps" -F --report_gbits -p "$port" 127.0.0.1 >/tmp/pt.cli 2>&1; then
			break
		fi
		tries=$((tries + 1))
		if ! grep -q "Couldn't connect" /tmp/pt.cli || [ "$tries" -ge 30 ]; then
			cat /tmp/pt.cli >&2
			kill "$srv" 2>/dev/null || true
			break
		fi
	done
	wait $srv || true
	awk -v s="$2" '$1 == s { print $4 }' /tmp/pt.cli | tail -1
}

gccl() { # op size -> Gb/s: requests of about 32 MiB (a batch of size-byte
	# descriptors, laid out in reverse on the target so that each is a work
	# request), as perftest keeps many messages in flight; from the bytes
	# and the average time of a request
	batch=$(( (32 << 20) / $2 ))
	[ "$batch" -ge 1 ] || batch=1
	"$bench" -op "$1" -target dram -backend rdma -b "$2" -e "$2" -batch "$batch" -n "$gccl_iters" -w 1 -check=false 2>/dev/null |
		awk -v s="$2" '$1 == s { printf "%.3f\n", $3 * 8 / ($9 * 1000) }'
}

rounds=${RDMA_ROUNDS:-1}
echo "# $(date -u +%FT%TZ) $(uname -r), device $dev GID $gidx, perftest ${RDMA_ITERS:-32 MiB of} messages per QP -q $qps, gccl $gccl_iters requests of ~32 MiB, $rounds round(s)"
: >/tmp/pt.ratios
printf '%-6s %10s %5s %12s %12s %7s\n' op bytes round gccl_Gb/s perftest_Gb/s ratio
for op in write read; do
	for s in $sizes; do
		r=1
		while [ "$r" -le "$rounds" ]; do
			p=$(perftest "ib_${op}_bw" "$s")
			g=$(gccl "$op" "$s")
			printf '%-6s %10s %5s %12s %12s %7s\n' "$op" "$s" "$r" "$g" "$p" "$(awk -v g="$g" -v p="$p" 'BEGIN { if (p > 0) printf "%.0f%%", 100 * g / p; else print "-" }')"
			awk -v o="$op" -v s="$s" -v g="$g" -v p="$p" 'BEGIN { if (p > 0) printf "%s %s %.4f\n", o, s, g / p }' >>/tmp/pt.ratios
			r=$((r + 1))
		done
	done
done
echo "# median ratio per op and size (gccl / perftest)"
sort -k1,1 -k2,2n -k3,3g /tmp/pt.ratios | awk '
	function flush() { if (n) printf "%-6s %10s median %4.0f%% of %d\n", op, sz, 100 * (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2), n }
	$1 != op || $2 != sz { flush(); op = $1; sz = $2; n = 0 }
	{ v[++n] = $3 }
	END { flush() }'
