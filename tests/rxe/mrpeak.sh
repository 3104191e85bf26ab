#!/bin/sh
# tests/rxe/mrpeak.sh: peak memory regions and QPs on rxe0 during one
# gccl-perf job over RDMA (GCCL_SHM_DISABLE=1), for each GCCL_RUNTIME_CONNECT
# value in $MODES (default "1 0"); $GP is the gccl-perf binary, $NP the
# processes (12). Run it in the VM:
#   GP=/tmp/gp NP=12 RXE_VM_ENV="GP NP MODES" tests/rxe/vm.sh --setup -- tests/rxe/mrpeak.sh
for m in ${MODES:-1 0}; do
  start=$(date +%s.%N)
  GCCL_RUNTIME_CONNECT=$m GCCL_SHM_DISABLE=1 GCCL_SOCKET_IFNAME=lo $GP all_reduce -np ${NP:-12} -b 1M -e 1M -n 2 -w 1 -c 1 > /tmp/out.$m 2>&1 &
  pid=$!; pm=0; pq=0
  while kill -0 $pid 2>/dev/null; do
    n=$(rdma resource show mr 2>/dev/null | wc -l); [ "$n" -gt "$pm" ] && pm=$n
    q=$(rdma resource show qp 2>/dev/null | grep -vc " type GSI\| type SMI"); [ "$q" -gt "$pq" ] && pq=$q
    sleep 0.2
  done
  wait $pid; rc=$?
  end=$(date +%s.%N)
  echo "GCCL_RUNTIME_CONNECT=$m rc=$rc peak MRs $pm peak QPs(non-GSI) $pq wall $(echo "$end - $start" | bc)s"
  [ $rc = 0 ] || tail -30 /tmp/out.$m
  grep -E "Out of bounds|Avg bus|wrong|1048576" /tmp/out.$m | head -4
done
