// Package verbs is gccl's binding to the RDMA verbs (InfiniBand and RoCE),
// for the transports built on them. libibverbs.so.1 is loaded at run time
// (dlopen; GCCL_IBVERBS_LIBRARY names another file), so gccl builds without
// rdma-core's headers and runs where it is not installed; without cgo, on
// another system than Linux, without the library or without a device, the
// calls return errors wrapping ErrNotSupported that say why.
//
// What it offers:
//   - Devices and ports from sysfs (Devices), filtered as GCCL_IB_HCA says
//     (HCAFilter, NCCL_IB_HCA's syntax), each port's GID chosen by ChooseGID
//     (RoCE v2 with an IPv4 address first; GCCL_IB_GID_INDEX forces one),
//     and the port a rank uses chosen nearest its GPU or NUMA node in the
//     host's topology (Candidates, Choose, Select: PIX before PXB before PHB
//     before SYS, ties spread by local rank, the choice logged).
//   - Open devices (Context), their protection domains (PD), memory
//     registration (MR), completion queues with a completion channel (CQ:
//     Poll, and Wait, which spins briefly and then sleeps on the channel's
//     descriptor until a completion or a deadline) and RC queue pairs (QP).
//   - A QP is connected by exchanging Endpoints (QP number, PSN, GID, LID,
//     MTU: a fixed 32-byte wire form) out of band and calling Connect with
//     the peer's, which moves it INIT -> RTR -> RTS with the attributes
//     InitAttr, RTRAttr and RTSAttr build from Config (GCCL_IB_TIMEOUT,
//     GCCL_IB_RETRY_CNT, GCCL_IB_TC, GCCL_IB_SL). QP.Fail moves it to ERR,
//     which flushes its outstanding work requests (cancel, teardown).
//   - PostSend posts chains of RDMA WRITE, WRITE with immediate, READ and
//     SEND requests with scatter/gather lists, PostRecv receives; CQ.Poll
//     returns completions whose Status names what failed (as
//     ibv_wc_status_str); CQ.Check turns a failed one into an error that
//     names the device, the QP and the status. PostSend, PostRecv and Poll
//     allocate nothing.
//   - Live counts the objects not yet closed, for leak tests.
//
// Objects are closed children first (QPs and MRs, then CQs and PDs, then
// the Context); closing a parent with live children is an error that
// says so. Every object is safe for concurrent use.
package verbs

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/gccl/gccl/internal/errs"
)

// ErrNotSupported is wrapped by the errors of a system where verbs cannot
// be used: no cgo or not Linux, no libibverbs.so.1, no RDMA device, or
// GCCL_IB_DISABLE=1.
var ErrNotSupported error = errs.New(errs.ErrNotSupported, "verbs: RDMA verbs are not supported here")

// ErrClosed is returned by calls on a closed object.
var ErrClosed error = errs.New(errs.ErrClosed, "verbs: closed")

// ErrTimeout is wrapped by CQ.Wait's error when its deadline passes.
var ErrTimeout error = errs.New(errs.ErrTimeout, "verbs: timed out")

// ErrInvalidArgument is wrapped by the errors of calls with bad arguments,
// which did nothing.
var ErrInvalidArgument error = errs.New(errs.ErrInvalidArgument, "verbs: invalid argument")

// ErrFlushed matches (errors.Is) the error of a work request that was
// flushed because its QP went to ERR.
var ErrFlushed = errors.New("verbs: work request flushed")

// Error is a verbs call that failed.
type Error struct {
	Op     string // "ibv_reg_mr", "ibv_post_send", "modify to RTR", ...
	Device string
	QPN    uint32 // the QP concerned; 0 when none
	Err    error  // a syscall.Errno, or what went wrong
	Hint   string // what to do about it, when known
}

func (e *Error) Error() string {
	s := "verbs: " + e.Device
	if e.QPN != 0 {
		s += fmt.Sprintf(" QP %#x", e.QPN)
	}
	s += ": " + e.Op + ": " + e.Err.Error()
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// WCError is a work request that completed with an error status.
type WCError struct {
	Device string
	WC     WC
}

func (e *WCError) Error() string {
	return fmt.Sprintf("verbs: %s QP %#x: work request %#x failed: %v (status %d, vendor error %#x)",
		e.Device, e.WC.QPNum, e.WC.WRID, e.WC.Status, uint32(e.WC.Status), e.WC.VendorErr)
}

// Is makes a flushed request match ErrFlushed.
func (e *WCError) Is(target error) bool { return target == ErrFlushed && e.WC.Status == WCFlushErr }

// wcError returns nil for a successful completion, else its error.
func wcError(dev string, wc *WC) error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Device: dev, WC: *wc}
}

// LiveCounts is how many objects of each kind are open in the process.
type LiveCounts struct {
	Contexts, PDs, MRs, CQs, QPs int64
}

// Total is the number of open objects.
func (l LiveCounts) Total() int64 { return l.Contexts + l.PDs + l.MRs + l.CQs + l.QPs }

func (l LiveCounts) String() string {
	return fmt.Sprintf("%d contexts, %d PDs, %d MRs, %d CQs, %d QPs", l.Contexts, l.PDs, l.MRs, l.CQs, l.QPs)
}

var live struct{ contexts, pds, mrs, cqs, qps atomic.Int64 }

// Live counts the objects created and not yet closed.
func Live() LiveCounts {
	return LiveCounts{live.contexts.Load(), live.pds.Load(), live.mrs.Load(), live.cqs.Load(), live.qps.Load()}
}

// regHint explains a failed memory registration: with ENOMEM or EPERM it
// is usually the locked-memory limit.
func regHint(errno uintptr, n int, memlock uint64, unlimited bool) string {
	const enomem, eperm, efault = 12, 1, 14
	switch errno {
	case enomem, eperm:
		lim := "unlimited"
		if !unlimited {
			lim = fmt.Sprintf("%d bytes", memlock)
		}
		return fmt.Sprintf("registering %d bytes pins them, and RLIMIT_MEMLOCK is %s: raise it with `ulimit -l unlimited`, in a container `--ulimit memlock=-1`, or in /etc/security/limits.conf", n, lim)
	case efault:
		return "the range is not mapped memory of this process"
	}
	return ""
}
