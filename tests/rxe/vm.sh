#!/usr/bin/env bash
# tests/rxe/vm.sh: run a command against the REAL rdma-core user space and
# kernel verbs stack, with Soft-RoCE (rdma_rxe), inside a throwaway qemu VM
# booted from Debian's own kernel package, on a host whose kernel has no
# RDMA support.
#
#   vm.sh --prepare                 fetch and build the kernel + initramfs only
#   vm.sh [--setup] -- CMD [ARGS]   run CMD in one VM, from $PWD; --setup first
#                                   puts rxe0 on a veth pair (169.254.77.1) and
#                                   exports RXEVM_GIDX (its RoCE v2 IPv4 GID)
#   vm.sh --two -- CMD [ARGS]       two VMs joined by a virtual wire, each with
#                                   rxe0 on its NIC; CMD runs in both with
#                                   RXEVM_RANK (0|1), RXEVM_SELF_ADDR,
#                                   RXEVM_PEER_ADDR (rank 0 is 169.254.77.1)
#                                   and RXEVM_GIDX exported
#
# The guest sees the host's whole file system read-only (virtfs) under a
# tmpfs overlay, so host-built binaries and libraries run there unchanged;
# RXEVM=1 is set in its environment. CMD's output is printed here after the
# VM powers off, and its exit status is this script's (125: no result from
# the VM). Nothing but the cache directory is left behind.
#
# Environment:
#   RXE_VM_DIR      cache and scratch directory (default /var/tmp/gccl-rxe)
#   RXE_VM_ACCEL    tcg | kvm (default tcg: nested KVM hangs on the build VMs)
#   RXE_VM_TIMEOUT  seconds for a VM (default 900)
#   RXE_VM_MEM      guest memory (default 2G)
#   RXE_VM_SMP      guest vCPUs (default 2; 1 each with --two)
#   RXE_VM_ENV      names of host variables to pass into the guest
#   RXE_VM_RW       host directories to share read-write, at their paths
#   RXE_VM_KPKG     the kernel package (default: what linux-image-amd64
#                   depends on now, e.g. linux-image-6.1.0-48-amd64)
#   RXE_VM_VERBOSE  1: stream the guest console to stderr
#   RXE_VM_KEEP     1: keep the job directory (console log) afterwards
#   RXE_VM_QUIET    1: no timing line on stderr when the job passes
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${RXE_VM_DIR:-/var/tmp/gccl-rxe}
ACCEL=${RXE_VM_ACCEL:-tcg}
TIMEOUT=${RXE_VM_TIMEOUT:-900}
MEM=${RXE_VM_MEM:-2G}
log() { echo "rxe-vm: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}'; }
T0=$(now)

orig_args=("$@")
mode=run setup=0
while [ $# -gt 0 ]; do
	case "$1" in
	--setup) setup=1; shift ;;
	--prepare) mode=prepare; shift ;;
	--two) mode=two; shift ;;
	--guest-job) mode=job; shift ;; # internal: --two's per-VM run
	--) shift; break ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) break ;;
	esac
done
if [ "$mode" != prepare ] && [ $# -eq 0 ]; then
	log "no command; see $0 --help"
	exit 2
fi
if [ "$(uname -m)" != x86_64 ]; then
	log "the VM is an x86_64 guest of Debian's amd64 kernel; this host is $(uname -m)"
	exit 125
fi

# --- 1. host packages ---------------------------------------------------------
# qemu, a static busybox for the initramfs, cpio, kmod (depmod, modprobe),
# iproute2's rdma tool and the RDMA user space the guest uses through virtfs.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v depmod >/dev/null || need+=(kmod)
command -v rdma >/dev/null || need+=(iproute2)
command -v ibv_devices >/dev/null || need+=(ibverbs-utils)
ls /usr/lib/*-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 || need+=(ibverbs-providers)
if [ ${#need[@]} -gt 0 ]; then
	[ "$(id -u)" = 0 ] || { log "need root to apt-get install ${need[*]}"; exit 125; }
	log "installing ${need[*]}"
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- 2. kernel + initramfs, cached per kernel package and init script -------
# The kernel's ABI name (6.1.0-NN) moves with Debian's security updates and
# old ones leave the mirror, so it is read from apt's lists on each run, and
# the lists are refreshed when they are missing or the download fails.
resolve_kpkg() {
	kpkg=${RXE_VM_KPKG:-$(apt-cache depends linux-image-amd64 2>/dev/null |
		awk '/Depends: linux-image-[0-9]/{print $2; exit}')}
	kver=${kpkg#linux-image-}
}
resolve_kpkg
if [ -z "$kpkg" ]; then
	apt-get update -qq >/dev/null
	resolve_kpkg
	[ -n "$kpkg" ] || { log "cannot find linux-image-amd64's kernel package in apt's lists"; exit 125; }
fi
# Modules the guest loads (modprobe adds their dependencies). rdma_rxe asks
# the crypto API for "crc32" (its ICRC); without crc32_generic (or
# crc32-pclmul) `rdma link add` fails with a bare "No such file or directory".
mods="virtio_pci virtio_net 9pnet_virtio 9p overlay veth crc32_generic crc32-pclmul rdma_rxe ib_uverbs rdma_ucm ib_umad"
key=$(cat "$here/guest-init.sh" /bin/busybox <(echo "$mods") | sha256sum | cut -c1-12)
kdir=$DIR/kernel/$kver
mkdir -p "$kdir"
exec 9>"$DIR/kernel/.lock"
flock 9 # concurrent runs (--two, go test -p N) build once
if [ ! -f "$kdir/initrd-$key.gz" ] || [ ! -f "$kdir/vmlinuz" ]; then
	tb=$(now)
	x=$(mktemp -d "$DIR/extract.XXXXXX")
	trap 'rm -rf "$x"' EXIT
	log "fetching $kpkg"
	if ! (cd "$x" && apt-get download -q "$kpkg" >/dev/null 2>&1); then
		apt-get update -qq >/dev/null
		old=$kpkg
		resolve_kpkg
		if [ "$kpkg" != "$old" ]; then
			rm -rf "$x"
			exec 9>&-
			log "the kernel is now $kpkg; starting again"
			exec "$0" "${orig_args[@]}"
		fi
		(cd "$x" && apt-get download -q "$kpkg" >/dev/null)
	fi
	dpkg-deb -x "$x"/"$kpkg"_*.deb "$x/root"
	cp "$x/root/boot/vmlinuz-$kver" "$kdir/vmlinuz"
	depmod -b "$x/root" "$kver"
	ir=$x/initrd
	mkdir -p "$ir"/{bin,sbin,dev,proc,sys,tmp,lib/modules/"$kver"}
	cp /bin/busybox "$ir/bin/busybox"
	cp "$here/guest-init.sh" "$ir/init"
	chmod 755 "$ir/init"
	# The modules keep their paths under a modules.dep of their own, so
	# that busybox modprobe (the kernel's request_module helper in the
	# guest) finds them; /lib/modules/order is the loading order.
	mr=$x/root/lib/modules/$kver
	for m in $mods; do
		modprobe -d "$x/root" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
	done | awk '!seen[$0]++' | while read -r ko; do
		rel=${ko#"$mr"/}
		mkdir -p "$ir/lib/modules/$kver/$(dirname "$rel")"
		cp "$ko" "$ir/lib/modules/$kver/$rel"
		echo "$rel"
	done >"$ir/lib/modules/order"
	cp "$mr"/modules.order "$mr"/modules.builtin* "$ir/lib/modules/$kver/"
	depmod -b "$ir" "$kver"
	echo "$kver" >"$ir/lib/modules/kver"
	(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) >"$kdir/initrd-$key.gz.tmp"
	mv "$kdir/initrd-$key.gz.tmp" "$kdir/initrd-$key.gz"
	find "$kdir" -name 'initrd-*.gz' ! -name "initrd-$key.gz" -delete
	rm -rf "$x"
	trap - EXIT
	log "built $kdir/initrd-$key.gz ($(du -h "$kdir/initrd-$key.gz" | cut -f1), $(since "$tb")s)"
fi
exec 9>&-
if [ "$mode" = prepare ]; then
	log "kernel $kver ready in $kdir"
	exit 0
fi

# --- 3. two VMs ----------------------------------------------------------------
# Each VM gets a virtio NIC; qemu joins the two back to back through a unix
# socket on the host (VM a listens, VM b connects). Nothing leaves the host.
if [ "$mode" = two ]; then
	tmp=$(mktemp -d "$DIR/two.XXXXXX")
	pa= pb=
	cleanup2() {
		for p in $pa $pb; do kill "$p" 2>/dev/null || true; done
		wait 2>/dev/null || true
		rm -rf "$tmp"
	}
	trap cleanup2 EXIT
	trap 'exit 130' INT TERM
	sock=$tmp/wire.sock
	nic() { echo "-netdev stream,id=n0,server=$1,addr.type=unix,addr.path=$sock -device virtio-net-pci,netdev=n0,mac=52:54:00:77:00:0$2"; }
	RXE_VM_SMP=${RXE_VM_SMP:-1} RXE_VM_QEMU_EXTRA="$(nic on 1)" RXE_VM_QUIET=1 \
		"$0" --guest-job -- sh "$here/guest-2vm.sh" 0 "$@" >"$tmp/a.out" 2>&1 &
	pa=$!
	for _ in $(seq 1 300); do [ -S "$sock" ] && break; sleep 0.1; done
	[ -S "$sock" ] || { log "VM 0 did not open $sock"; cat "$tmp/a.out" >&2; exit 125; }
	RXE_VM_SMP=${RXE_VM_SMP:-1} RXE_VM_QEMU_EXTRA="$(nic off 2)" RXE_VM_QUIET=1 \
		"$0" --guest-job -- sh "$here/guest-2vm.sh" 1 "$@" >"$tmp/b.out" 2>&1 &
	pb=$!
	ra=0 rb=0
	wait "$pa" || ra=$?
	wait "$pb" || rb=$?
	pa= pb=
	echo "######## VM 0 (169.254.77.1), rc=$ra"; cat "$tmp/a.out"
	echo "######## VM 1 (169.254.77.2), rc=$rb"; cat "$tmp/b.out"
	[ "${RXE_VM_QUIET:-0}" = 1 ] && [ $ra = 0 ] && [ $rb = 0 ] ||
		log "two VMs: accel=$ACCEL kernel=$kver total=$(since "$T0")s rc=$ra,$rb"
	[ $ra = 0 ] && [ $rb = 0 ]
	exit
fi

# --- 4. the job: what the guest runs -------------------------------------------
mkdir -p "$DIR"
job=$(mktemp -d "$DIR/job.XXXXXX")
qpid= tpid=
cleanup() {
	[ -n "$qpid" ] && kill "$qpid" 2>/dev/null || true
	[ -n "$tpid" ] && kill "$tpid" 2>/dev/null || true
	if [ "${RXE_VM_KEEP:-0}" = 1 ]; then log "kept $job"; else rm -rf "$job"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
sq() { printf "'%s'" "$(printf %s "$1" | sed "s/'/'\\\\''/g")"; }
{
	echo "# generated by tests/rxe/vm.sh"
	[ $setup = 1 ] && echo ". $(sq "$here/guest-setup.sh")"
	printf 'exec'
	for a in "$@"; do printf ' %s' "$(sq "$a")"; done
	echo
} >"$job/cmd.sh"
pwd >"$job/cwd"
: >"$job/env"
for v in ${RXE_VM_ENV:-}; do
	[ -n "${!v+x}" ] && echo "$v=$(sq "${!v}")" >>"$job/env"
done
rwargs=()
i=0
for p in ${RXE_VM_RW:-}; do
	p=$(readlink -f "$p")
	[ -d "$p" ] || { log "RXE_VM_RW: $p is not a directory"; exit 125; }
	echo "$p" >>"$job/rw"
	rwargs+=(-virtfs "local,path=$p,mount_tag=rw$i,security_model=none,multidevs=remap")
	i=$((i + 1))
done

# --- 5. boot -------------------------------------------------------------------
case "$ACCEL" in
kvm) accel=(-accel kvm -cpu host) ;;
*) accel=(-accel tcg,thread=multi -cpu max) ;;
esac
tq=$(now)
# shellcheck disable=SC2086 # RXE_VM_QEMU_EXTRA is split on blanks on purpose
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 "${accel[@]}" -m "$MEM" -smp "${RXE_VM_SMP:-2}" \
	-nodefaults -no-reboot -nic none -display none -monitor none \
	-serial "file:$job/console.log" \
	-kernel "$kdir/vmlinuz" -initrd "$kdir/initrd-$key.gz" \
	-append "console=ttyS0 panic=-1 quiet loglevel=3 rxevm.job=$job" \
	-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
	-virtfs "local,path=$job,mount_tag=job,security_model=none,multidevs=remap" \
	"${rwargs[@]}" ${RXE_VM_QEMU_EXTRA:-} </dev/null >"$job/qemu.log" 2>&1 &
qpid=$!
if [ "${RXE_VM_VERBOSE:-0}" = 1 ]; then
	tail -n +1 -F "$job/console.log" 2>/dev/null >&2 &
	tpid=$!
fi
qrc=0
wait "$qpid" || qrc=$?
qpid=
if [ -n "$tpid" ]; then
	sleep 0.2
	kill "$tpid" 2>/dev/null || true
	wait "$tpid" 2>/dev/null || true
	tpid=
fi

# --- 6. results ----------------------------------------------------------------
ready=$(awk -F'[][]' '/rxevm-init.*root ready/{print $2; exit}' "$job/console.log" 2>/dev/null)
if [ -f "$job/rc" ]; then
	[ "${RXE_VM_VERBOSE:-0}" = 1 ] || cat "$job/output"
	rc=$(cat "$job/rc")
	[ "${RXE_VM_QUIET:-0}" = 1 ] && [ "$rc" = 0 ] ||
		log "accel=$ACCEL kernel=$kver guest-ready=${ready:-?}s qemu=$(since "$tq")s total=$(since "$T0")s rc=$rc"
else
	rc=125
	[ $qrc = 124 ] && { rc=124; log "timed out after ${TIMEOUT}s"; }
	log "no result from the VM (qemu rc=$qrc); the console's last lines:"
	tail -n 30 "$job/console.log" >&2 2>/dev/null || true
	cat "$job/qemu.log" >&2 2>/dev/null || true
fi
exit "$rc"
