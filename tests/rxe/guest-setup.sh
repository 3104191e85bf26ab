# Sourced inside the rxe VM (never on the host): puts Soft-RoCE device rxe0
# on a network interface and exports RXEVM_GIDX, the index of its RoCE v2
# GID of the interface's IPv4 address, once the kernel has added it.
#   RXEVM_NETDEV, RXEVM_ADDR: the (existing) interface and its address/len;
#   by default a veth pair veth0/veth1 with 169.254.77.1/24 on veth0, so
#   that nothing leaves the VM (which has no NIC then).
# Several processes can use rxe0 at once (rxe loops packets to its own GID
# back in software); two rxe devices in one VM cannot reach each other.
stamp() { echo "== [$(cut -d' ' -f1 /proc/uptime)s] $*"; }
stamp "set up rxe0"
ip link set lo up
if [ -n "${RXEVM_NETDEV:-}" ]; then
	ip addr add "${RXEVM_ADDR:?}" dev "$RXEVM_NETDEV"
	ip link set "$RXEVM_NETDEV" up
else
	RXEVM_NETDEV=veth0
	ip link add veth0 type veth peer name veth1
	ip addr add 169.254.77.1/24 dev veth0
	ip link set veth1 up
	ip link set veth0 up
fi
rdma link add rxe0 type rxe netdev "$RXEVM_NETDEV" || { echo "rdma link add rxe0 failed"; exit 1; }
RXEVM_GIDX=
for _ in $(seq 1 100); do
	for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
		i=${g##*/}
		case "$(cat "$g" 2>/dev/null)" in
		0000:0000:0000:0000:0000:ffff:*)
			[ "$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/"$i" 2>/dev/null)" = "RoCE v2" ] && RXEVM_GIDX=$i ;;
		esac
		[ -n "$RXEVM_GIDX" ] && break
	done
	[ -n "$RXEVM_GIDX" ] && break
	sleep 0.1
done
[ -n "$RXEVM_GIDX" ] || { echo "rxe0 has no RoCE v2 GID of an IPv4 address"; exit 1; }
export RXEVM_GIDX
stamp "rxe0 on $RXEVM_NETDEV, RoCE v2 GID $RXEVM_GIDX: $(cat /sys/class/infiniband/rxe0/ports/1/gids/"$RXEVM_GIDX")"
