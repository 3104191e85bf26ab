#!/bin/sh
# The job of each of vm.sh --two's VMs, inside it: rxe0 on the virtio NIC
# eth0 (VM 0: 169.254.77.1, VM 1: .2), then, once the peer answers, CMD
# with RXEVM_RANK, RXEVM_SELF_ADDR, RXEVM_PEER_ADDR and RXEVM_GIDX set.
#   guest-2vm.sh RANK CMD [ARGS...]
set -eu
rank=$1
shift
case $rank in 0) me=1 peer=2 ;; 1) me=2 peer=1 ;; *) echo "rank 0 or 1"; exit 2 ;; esac
RXEVM_NETDEV=eth0 RXEVM_ADDR=169.254.77.$me/24 . "$(dirname "$0")/guest-setup.sh"
ok=
for _ in $(seq 1 120); do
	/run/rxevm/busybox ping -c1 -W1 169.254.77.$peer >/dev/null 2>&1 && { ok=1; break; }
done
[ -n "$ok" ] || { echo "the peer 169.254.77.$peer never answered"; exit 1; }
echo "== [$(cut -d' ' -f1 /proc/uptime)s] peer up"
export RXEVM_RANK=$rank RXEVM_SELF_ADDR=169.254.77.$me RXEVM_PEER_ADDR=169.254.77.$peer
exec "$@"
