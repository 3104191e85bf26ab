#!/bin/sh
# file_vs_fio.sh P2PBENCH [DIR]: gccl-p2pbench's file backend (O_DIRECT, one
# request of 16 blocks of 64 KiB in flight, as issue 31 measured NIXL) on
# io_uring and on its goroutine pool, against fio doing the same on the
# same disk: 16 adjacent 64 KiB O_DIRECT I/Os in a 1 MiB file, submitted
# together and all reaped before the next batch, with libaio (NIXL's POSIX
# backend) and io_uring. Rounds alternate the four (FILE_ROUNDS, default 3);
# every figure is GB/s (10^9 bytes per second). DIR (default /tmp) holds
# the two 1 MiB files.
#
#   go build -o /tmp/p2pbench ./cmd/gccl-p2pbench
#   cmd/gccl-p2pbench/file_vs_fio.sh /tmp/p2pbench
set -eu
bench=$1
dir=${2:-/tmp}
rounds=${FILE_ROUNDS:-3}
command -v fio >/dev/null || { echo "file_vs_fio.sh: fio is not installed (apt-get install fio)" >&2; exit 1; }
mkdir -p "$dir" # gccl-p2pbench opens its file in DIR; fio would make DIR only after the first gccl run

fiorun() { # engine op -> GB/s
	fio --name=x --filename="$dir/fio-64kx16.dat" --size=1M --rw="$2" --bs=64K --direct=1 --ioengine="$1" \
		--iodepth=16 --iodepth_batch_submit=16 --iodepth_batch_complete_min=16 --runtime=3 --time_based \
		--output-format=terse 2>/dev/null |
		awk -F';' -v op="$2" '{ kib = (op == "read") ? $7 : $48; printf "%.2f", kib * 1024 / 1e9 }'
}
gccl() { # op -> GB/s
	"$bench" -op "$1" -target file -file "$dir/p2pbench-64kx16.dat" -direct -qd 16 -bs 64K \
		-b 64K -e 64K -batch 16 -n 2000 -w 10 | tail -1 | awk '{ print $4 }'
}
echo "# op    gccl_io_uring  gccl_goroutines  fio_libaio  fio_io_uring"
r=1
while [ "$r" -le "$rounds" ]; do
	for op in write read; do
		g=$(gccl "$op")
		w=$(GCCL_P2P_IOURING_DISABLE=1 gccl "$op")
		printf "%-6s  %13s  %15s  %10s  %12s\n" "$op" "$g" "$w" "$(fiorun libaio "$op")" "$(fiorun io_uring "$op")"
	done
	r=$((r + 1))
done
rm -f "$dir/fio-64kx16.dat" "$dir/p2pbench-64kx16.dat"
