#!/bin/busybox sh
# /init of the rxe VM's initramfs (busybox, static), built into it by
# vm.sh; never run on the host.
#
# 1. load the modules listed in /lib/modules/order (virtio, 9p, overlay,
#    veth, ib_core, ib_uverbs, rdma_rxe, ...);
# 2. mount the host's root (virtfs tag "hostroot", read-only) under a tmpfs
#    overlay, so that the guest sees the host's user space (libibverbs, the
#    rxe provider, iproute2's rdma, a Go test binary) unchanged and may write
#    anywhere (the writes are lost at power-off);
# 3. mount the job share (virtfs tag "job", read-write) at the path it has
#    on the host (rxevm.job=PATH on the kernel command line), and the extra
#    read-write shares (PATH/rw) at theirs;
# 4. run PATH/cmd.sh with the host's /bin/sh, chrooted, from the directory
#    in PATH/cwd, with the variables in PATH/env and RXEVM=1; its output
#    goes to PATH/output (and the console), its exit status to PATH/rc;
# 5. power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
up() { cut -d' ' -f1 /proc/uptime; }
say() { echo "rxevm-init[$(up)]: $*"; }
die() { say "FATAL: $*"; echo 125 > /job/rc 2>/dev/null; sync; poweroff -f; }

job=
for w in $(cat /proc/cmdline); do
	case "$w" in rxevm.job=*) job="${w#rxevm.job=}" ;; esac
done
say "kernel up"

kver=$(cat /lib/modules/kver)
echo /bin/modprobe > /proc/sys/kernel/modprobe
for m in $(cat /lib/modules/order); do
	insmod "/lib/modules/$kver/$m" 2>/dev/null || say "insmod $m failed"
done
say "modules loaded"

mkdir -p /job /ro /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none job /job ||
	die "cannot mount the job share"
[ -n "$job" ] || die "no rxevm.job= on the kernel command line"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=loose,ro hostroot /ro ||
	die "cannot mount the host's root"
mount -t tmpfs -o size=50% rw /rw
mkdir -p /rw/upper /rw/work
overlay=1
if ! mount -t overlay overlay -o lowerdir=/ro,upperdir=/rw/upper,workdir=/rw/work /newroot; then
	say "no overlay; the host's root read-only, with tmpfs on /tmp and /root"
	overlay=0
	mount --bind /ro /newroot
fi
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs shm /newroot/dev/shm
mount -t tmpfs run /newroot/run
# This busybox, for jobs that want ping and the like.
mkdir -p /newroot/run/rxevm && cp /bin/busybox /newroot/run/rxevm/busybox
if [ $overlay = 0 ]; then
	mount -t tmpfs tmp /newroot/tmp
	mount -t tmpfs home /newroot/root
fi
# The guest kernel's modules (those in the initramfs).
mkdir -p "/newroot/lib/modules/$kver"
mount --bind "/lib/modules/$kver" "/newroot/lib/modules/$kver"
i=0
if [ -f /job/rw ]; then
	while read -r p; do
		mkdir -p "/newroot$p" &&
			mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none "rw$i" "/newroot$p" ||
			die "cannot mount rw$i at $p"
		i=$((i + 1))
	done < /job/rw
fi
# The job share goes last, at its host path.
mkdir -p "/newroot$job" || die "cannot make $job in the guest"
mount --move /job "/newroot$job" || die "cannot move the job share to $job"
say "root ready"

cwd=/
[ -f "/newroot$job/cwd" ] && cwd=$(cat "/newroot$job/cwd")
( chroot /newroot /usr/bin/env -i PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	HOME=/root TMPDIR=/tmp RXEVM=1 \
	/bin/sh -c 'set -a; [ -f "$1/env" ] && . "$1/env"; set +a; cd "$2" || exit 126; exec /bin/sh "$1/cmd.sh"' \
	rxevm "$job" "$cwd" 2>&1
  echo $? > /tmp/rc ) | tee "/newroot$job/output"
cp /tmp/rc "/newroot$job/rc"
say "job done, rc=$(cat /tmp/rc)"
sync
umount "/newroot$job" 2>/dev/null
poweroff -f
