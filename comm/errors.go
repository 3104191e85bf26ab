package comm

import (
	"errors"
	"fmt"

	"github.com/gccl/gccl/internal/errs"
)

// Errors a caller can test with errors.Is. Every error gccl returns wraps one
// of these (or a context error) and says which operation and rank failed.
var (
	// ErrInvalidArgument: the call's arguments are wrong (lengths, types,
	// op, root, peer, aliasing). Nothing was sent; the Comm is unchanged.
	ErrInvalidArgument error = errs.New(errs.ErrInvalidArgument, "gccl: invalid argument")
	// ErrClosed: the Comm was closed.
	ErrClosed error = errs.New(errs.ErrClosed, "gccl: communicator closed")
	// ErrAborted: the Comm was aborted, by Abort or by an earlier failure.
	ErrAborted = errors.New("gccl: communicator aborted")
	// ErrPeerLost: a peer closed, aborted or died during the operation.
	ErrPeerLost = errors.New("gccl: peer lost")
	// ErrTimeout: the operation did not complete within the Comm's timeout.
	ErrTimeout error = errs.New(errs.ErrTimeout, "gccl: operation timed out")
	// ErrMismatch: ranks issued different operations or sizes at the same
	// point (every rank must issue the same collectives in the same order).
	ErrMismatch = errors.New("gccl: ranks disagree on the operation")
	// ErrConcurrentUse: two goroutines used one Comm at the same time.
	ErrConcurrentUse = errors.New("gccl: concurrent use of a communicator")
	// ErrNotSupported: the hardware or feature is absent.
	ErrNotSupported error = errs.ErrNotSupported
)

// OpError describes a failed operation.
type OpError struct {
	Op   string // "AllReduce", "Send", ...
	Rank int    // the rank that reports the error
	Seq  uint64 // the operation's sequence number on this Comm (1 = first)
	Peer int    // the peer involved, or -1
	Err  error
}

func (e *OpError) Error() string {
	s := fmt.Sprintf("gccl: rank %d: %s", e.Rank, e.Op)
	if e.Seq > 0 { // calls that are not numbered (Group, Shrink) have none
		s += fmt.Sprintf(" #%d", e.Seq)
	}
	if e.Peer >= 0 {
		s += fmt.Sprintf(" (peer rank %d)", e.Peer)
	}
	return s + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}
