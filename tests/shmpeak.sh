#!/bin/bash
# shmpeak.sh GCCL_PERF NP [gccl-perf flags]: runs one 8 B all-reduce job of
# NP processes on this host (N iterations, default 1) and prints its wall
# time and the peak of /dev/shm's use above what it was before, sampled with
# df every 5 ms (the mailboxes are unlinked once every rank mapped them, so
# du cannot see them). Nothing else should use /dev/shm meanwhile.
set -u
bin=$1 np=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
used() { df -k --output=used /dev/shm | tail -1; }
base=$(used)
(
	peak=0
	while [ ! -e "$tmp/done" ]; do
		u=$(used)
		[ "$u" -gt "$peak" ] && peak=$u && echo "$peak" >"$tmp/peak"
		sleep 0.005
	done
) &
start=$(date +%s.%N)
"$bin" all_reduce -np "$np" -b 8 -e 8 -n "${N:-1}" "$@" >"$tmp/out" 2>&1
rc=$?
end=$(date +%s.%N)
touch "$tmp/done"
wait
[ $rc -eq 0 ] || tail -5 "$tmp/out" >&2
echo "np=$np rc=$rc wall=$(echo "$end - $start" | bc) s peak_shm=$(($(cat "$tmp/peak" 2>/dev/null || echo "$base") - base)) KiB"
exit $rc
