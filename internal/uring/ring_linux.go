package uring

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel ABI (include/uapi/linux/io_uring.h).
const (
	opReadFixed   = 4
	opWriteFixed  = 5
	opAsyncCancel = 14
	opRead        = 22
	opWrite       = 23

	setupClamp        = 1 << 4
	setupSubmitAll    = 1 << 7
	setupCoopTaskrun  = 1 << 8
	featSingleMmap    = 1 << 0
	featExtArg        = 1 << 8
	enterGetEvents    = 1 << 0
	enterExtArg       = 1 << 3
	asyncCancelAny    = 1 << 2
	registerBuffers   = 0
	unregisterBuffers = 1

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// sqe is struct io_uring_sqe (64 bytes); opFlags is the rw_flags /
// cancel_flags union.
type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	opFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFDIn  int32
	addr3       uint64
	pad         uint64
}

type geteventsArg struct {
	sigmask   uint64
	sigmaskSz uint32
	minWait   uint32
	ts        uint64
}

// Ring is one io_uring instance.
type Ring struct {
	fd       int
	ringMem  []byte // SQ and CQ rings (one mapping: IORING_FEAT_SINGLE_MMAP)
	sqeMem   []byte
	sqHead   *uint32 // the kernel's
	sqTail   *uint32 // ours
	sqMask   uint32
	entries  uint32
	sqes     []sqe
	cqHead   *uint32 // ours
	cqTail   *uint32 // the kernel's
	cqMask   uint32
	cqes     []CQE
	extArg   bool
	tail     uint32 // local copy of *sqTail
	waitArg  geteventsArg
	waitTime unix.Timespec
}

var availability = sync.OnceValue(func() error {
	if b, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); err == nil && strings.TrimSpace(string(b)) == "2" {
		return fmt.Errorf("%w: disabled by kernel.io_uring_disabled=2", ErrNotSupported)
	}
	r, err := New(1)
	if err != nil {
		return err
	}
	return r.Close()
})

// Available returns nil where a ring can be set up (checked once per
// process), or why not: kernel.io_uring_disabled=2, or io_uring_setup
// refused (ENOSYS without io_uring, EPERM under disabled=1 or seccomp).
func Available() error { return availability() }

// New sets up a ring with at least entries submission entries (rounded up
// to a power of two by the kernel) and twice as many completion entries.
func New(entries uint32) (*Ring, error) {
	if entries < 1 {
		return nil, errors.New("uring: zero entries")
	}
	var p params
	fd := -1
	// SUBMIT_ALL (5.18) keeps submitting past an entry that fails at once;
	// COOP_TASKRUN (5.19) runs completions when this thread next enters the
	// kernel instead of interrupting it. Older kernels refuse the flags.
	for _, flags := range []uint32{setupClamp | setupSubmitAll | setupCoopTaskrun, setupClamp} {
		p = params{flags: flags}
		r1, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
		if e == 0 {
			fd = int(r1)
			break
		}
		if e != unix.EINVAL {
			return nil, setupErr(e)
		}
	}
	if fd < 0 {
		return nil, fmt.Errorf("%w: io_uring_setup: %v", ErrNotSupported, unix.EINVAL)
	}
	r := &Ring{fd: fd, entries: p.sqEntries, extArg: p.features&featExtArg != 0}
	if err := r.mapRings(&p); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func setupErr(e unix.Errno) error {
	switch e {
	case unix.ENOSYS, unix.EPERM, unix.EACCES:
		return fmt.Errorf("%w: io_uring_setup: %v", ErrNotSupported, e)
	}
	return fmt.Errorf("uring: io_uring_setup: %w", e)
}

func (r *Ring) mapRings(p *params) error {
	if p.features&featSingleMmap == 0 {
		return fmt.Errorf("%w: kernel without IORING_FEAT_SINGLE_MMAP (before 5.4)", ErrNotSupported)
	}
	sqSize := int(p.sqOff.array) + int(p.sqEntries)*4
	cqSize := int(p.cqOff.cqes) + int(p.cqEntries)*int(unsafe.Sizeof(CQE{}))
	var err error
	prot, flags := unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE
	if r.ringMem, err = unix.Mmap(r.fd, offSQRing, max(sqSize, cqSize), prot, flags); err != nil {
		return fmt.Errorf("uring: mmap of the rings: %w", err)
	}
	if r.sqeMem, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*int(unsafe.Sizeof(sqe{})), prot, flags); err != nil {
		return fmt.Errorf("uring: mmap of the entries: %w", err)
	}
	at := func(off uint32) unsafe.Pointer { return unsafe.Pointer(&r.ringMem[off]) }
	r.sqHead, r.sqTail = (*uint32)(at(p.sqOff.head)), (*uint32)(at(p.sqOff.tail))
	r.sqMask = *(*uint32)(at(p.sqOff.ringMask))
	r.cqHead, r.cqTail = (*uint32)(at(p.cqOff.head)), (*uint32)(at(p.cqOff.tail))
	r.cqMask = *(*uint32)(at(p.cqOff.ringMask))
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	r.cqes = unsafe.Slice((*CQE)(at(p.cqOff.cqes)), p.cqEntries)
	// The indirection array maps ring slot i to entry i once and for all.
	array := unsafe.Slice((*uint32)(at(p.sqOff.array)), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.tail = atomic.LoadUint32(r.sqTail)
	return nil
}

// Close unmaps the rings and closes the ring's descriptor. Requests still
// in flight are cancelled by the kernel, but their memory may be used until
// they end: close a ring only once its completions are all reaped.
func (r *Ring) Close() error {
	var err error
	if r.sqeMem != nil {
		err = errors.Join(err, unix.Munmap(r.sqeMem))
		r.sqeMem, r.sqes = nil, nil
	}
	if r.ringMem != nil {
		err = errors.Join(err, unix.Munmap(r.ringMem))
		r.ringMem, r.cqes = nil, nil
	}
	if r.fd >= 0 {
		err = errors.Join(err, unix.Close(r.fd))
		r.fd = -1
	}
	return err
}

// Entries is the submission queue's size.
func (r *Ring) Entries() int { return int(r.entries) }

// Space is how many entries can be prepared before the next Submit.
func (r *Ring) Space() int { return int(r.entries - (r.tail - atomic.LoadUint32(r.sqHead))) }

func (r *Ring) next() *sqe {
	if r.Space() == 0 {
		return nil
	}
	e := &r.sqes[r.tail&r.sqMask]
	*e = sqe{}
	return e
}

// publish makes the entry just filled visible to the kernel: the store of
// the tail is a release (sync/atomic is sequentially consistent), so the
// kernel's acquire load of the tail sees the entry's fields.
func (r *Ring) publish() {
	r.tail++
	atomic.StoreUint32(r.sqTail, r.tail)
}

func (r *Ring) prepRW(op uint8, fd int, buf []byte, off int64, index uint16, ud uint64) bool {
	e := r.next()
	if e == nil {
		return false
	}
	e.opcode, e.fd, e.off, e.len, e.userData, e.bufIndex = op, int32(fd), uint64(off), uint32(len(buf)), ud, index
	if len(buf) > 0 {
		e.addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	}
	r.publish()
	return true
}

// PrepRead queues a read of len(buf) bytes of fd at off; false when the
// submission queue is full.
func (r *Ring) PrepRead(fd int, buf []byte, off int64, ud uint64) bool {
	return r.prepRW(opRead, fd, buf, off, 0, ud)
}

// PrepWrite queues a write of buf to fd at off; false when the queue is full.
func (r *Ring) PrepWrite(fd int, buf []byte, off int64, ud uint64) bool {
	return r.prepRW(opWrite, fd, buf, off, 0, ud)
}

// PrepReadFixed is PrepRead into registered buffer index (buf lies in it).
func (r *Ring) PrepReadFixed(fd int, buf []byte, off int64, index uint16, ud uint64) bool {
	return r.prepRW(opReadFixed, fd, buf, off, index, ud)
}

// PrepWriteFixed is PrepWrite from registered buffer index.
func (r *Ring) PrepWriteFixed(fd int, buf []byte, off int64, index uint16, ud uint64) bool {
	return r.prepRW(opWriteFixed, fd, buf, off, index, ud)
}

// PrepCancelAll queues a cancellation of every request of the ring (Linux
// 5.19, IORING_ASYNC_CANCEL_ANY): those not yet started complete with
// -ECANCELED; one already on the device runs to its end. Its own
// completion (ud) says how many it cancelled, or -ENOENT/-EALREADY.
func (r *Ring) PrepCancelAll(ud uint64) bool {
	e := r.next()
	if e == nil {
		return false
	}
	e.opcode, e.fd, e.opFlags, e.userData = opAsyncCancel, -1, asyncCancelAny, ud
	r.publish()
	return true
}

// Submit hands the kernel every prepared entry in one io_uring_enter and,
// with wait > 0, waits until at least wait completions are ready or
// timeout (> 0; where the kernel has IORING_FEAT_EXT_ARG) passes. It
// returns how many entries the kernel took.
func (r *Ring) Submit(wait int, timeout time.Duration) (int, error) {
	if r.fd < 0 {
		return 0, errors.New("uring: ring closed")
	}
	var flags, arg, argSize uintptr
	if wait > 0 {
		flags |= enterGetEvents
		if timeout > 0 && r.extArg {
			r.waitTime = unix.NsecToTimespec(timeout.Nanoseconds())
			r.waitArg = geteventsArg{ts: uint64(uintptr(unsafe.Pointer(&r.waitTime)))}
			flags |= enterExtArg
			arg, argSize = uintptr(unsafe.Pointer(&r.waitArg)), unsafe.Sizeof(r.waitArg)
		}
	}
	for {
		toSubmit := r.tail - atomic.LoadUint32(r.sqHead)
		// Syscall, not RawSyscall: the wait blocks, and the runtime must
		// run other goroutines meanwhile.
		n, _, e := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(wait), flags, arg, argSize)
		runtime.KeepAlive(r)
		switch e {
		case 0:
			return int(n), nil
		case unix.EINTR: // nothing was taken (the kernel returns a count if anything was)
			continue
		case unix.ETIME:
			return 0, nil
		}
		return 0, fmt.Errorf("uring: io_uring_enter: %w", e)
	}
}

// Completion returns the next ready completion and consumes it. The load
// of the kernel's tail is an acquire (the entry's fields are then
// visible), the store of our head a release (the kernel may then reuse
// the slot).
func (r *Ring) Completion() (CQE, bool) {
	head := atomic.LoadUint32(r.cqHead)
	if head == atomic.LoadUint32(r.cqTail) {
		return CQE{}, false
	}
	c := r.cqes[head&r.cqMask]
	atomic.StoreUint32(r.cqHead, head+1)
	return c, true
}

// RegisterBuffers pins bufs for Prep*Fixed, buffer i being bufs[i] (each
// at most 1 GiB; RLIMIT_MEMLOCK may limit the total on old kernels).
func (r *Ring) RegisterBuffers(bufs [][]byte) error {
	iov := make([]unix.Iovec, len(bufs))
	for i, b := range bufs {
		iov[i].Base = unsafe.SliceData(b)
		iov[i].SetLen(len(b))
	}
	_, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerBuffers, uintptr(unsafe.Pointer(unsafe.SliceData(iov))), uintptr(len(iov)), 0, 0)
	runtime.KeepAlive(iov)
	if e != 0 {
		return fmt.Errorf("uring: registering %d buffers: %w", len(bufs), e)
	}
	return nil
}

// UnregisterBuffers drops the registered buffers.
func (r *Ring) UnregisterBuffers() error {
	_, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), unregisterBuffers, 0, 0, 0, 0)
	if e != 0 {
		return fmt.Errorf("uring: unregistering buffers: %w", e)
	}
	return nil
}
