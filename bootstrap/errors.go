package bootstrap

import (
	"context"
	"errors"
	"fmt"

	"github.com/gccl/gccl/internal/errs"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Errors returned by this package wrap one of these sentinels (test with
// errors.Is); the message says which rank and what to do.
var (
	// ErrUnauthenticated: the rendezvous rejected the job secret.
	ErrUnauthenticated = errors.New("wrong job secret")
	// ErrVersionMismatch: ranks or the rendezvous run different gccl builds.
	ErrVersionMismatch = errors.New("gccl version mismatch")
	// ErrJoinRejected: the rendezvous refused the rank (wrong size, rank out
	// of range, or a rank that already joined).
	ErrJoinRejected = errors.New("join rejected")
	// ErrTimeout: a blocking call did not complete in time.
	ErrTimeout error = errs.New(errs.ErrTimeout, "timed out")
	// ErrClosed: the Client was closed.
	ErrClosed error = errs.New(errs.ErrClosed, "bootstrap client closed")
	// ErrRankLost: a rank needed by the call died, stalled or left.
	ErrRankLost = errors.New("rank lost")
	// ErrAborted: a rank called Abort.
	ErrAborted = errors.New("job aborted")
	// ErrRendezvousLost: the rendezvous server stopped or cannot be reached.
	ErrRendezvousLost = errors.New("rendezvous lost")
	// ErrInvalidArgument: a bad Config, environment or argument, or ranks
	// that made different bootstrap calls in the same order slot.
	ErrInvalidArgument error = errs.New(errs.ErrInvalidArgument, "invalid argument")
	// ErrMismatch, a kind of ErrInvalidArgument: ranks made different
	// bootstrap calls in the same order slot (or Shrink with different
	// lists).
	ErrMismatch = fmt.Errorf("%w: ranks disagree", ErrInvalidArgument)
)

// Reasons carried in a google.rpc.ErrorInfo detail of every error status the
// server returns, so clients map errors exactly rather than guess from codes.
const (
	errorDomain          = "bootstrap.gccl"
	reasonWrongSecret    = "WRONG_SECRET"
	reasonVersion        = "VERSION_MISMATCH"
	reasonJoinRejected   = "JOIN_REJECTED"
	reasonTimeout        = "TIMEOUT"
	reasonRankLost       = "RANK_LOST"
	reasonAborted        = "ABORTED"
	reasonServerStopped  = "SERVER_STOPPED"
	reasonInvalid        = "INVALID_ARGUMENT"
	reasonNotMember      = "NOT_MEMBER"
	reasonDeclaredLost   = "DECLARED_LOST"
	reasonRoundMismatch  = "ROUND_MISMATCH"
	reasonValueNotNumber = "NOT_A_NUMBER"
)

var reasonSentinel = map[string]error{
	reasonWrongSecret:    ErrUnauthenticated,
	reasonVersion:        ErrVersionMismatch,
	reasonJoinRejected:   ErrJoinRejected,
	reasonTimeout:        ErrTimeout,
	reasonRankLost:       ErrRankLost,
	reasonDeclaredLost:   ErrRankLost,
	reasonAborted:        ErrAborted,
	reasonServerStopped:  ErrRendezvousLost,
	reasonInvalid:        ErrInvalidArgument,
	reasonNotMember:      ErrInvalidArgument,
	reasonRoundMismatch:  ErrMismatch,
	reasonValueNotNumber: ErrInvalidArgument,
}

var codeSentinel = map[codes.Code]error{
	codes.Unauthenticated:    ErrUnauthenticated,
	codes.FailedPrecondition: ErrVersionMismatch,
	codes.AlreadyExists:      ErrJoinRejected,
	codes.DeadlineExceeded:   ErrTimeout,
	codes.Aborted:            ErrAborted,
	codes.Unavailable:        ErrRendezvousLost,
	codes.InvalidArgument:    ErrInvalidArgument,
}

// statusError builds the server's error status with its ErrorInfo reason.
func statusError(code codes.Code, reason, format string, args ...any) error {
	st := status.New(code, fmt.Sprintf(format, args...))
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// remoteError is an error status from the server: its text is the server's
// message, and it unwraps to the matching sentinel.
type remoteError struct {
	sentinel error
	msg      string
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// fromStatus maps an RPC error to an error wrapping one of the sentinels.
func fromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == errorDomain {
			if s, ok := reasonSentinel[info.Reason]; ok {
				return &remoteError{sentinel: s, msg: st.Message()}
			}
		}
	}
	switch st.Code() {
	case codes.Canceled:
		return fmt.Errorf("%s: %w", st.Message(), context.Canceled)
	case codes.Unavailable:
		return &remoteError{sentinel: ErrRendezvousLost, msg: "rendezvous unreachable: " + st.Message()}
	}
	if s, ok := codeSentinel[st.Code()]; ok {
		return &remoteError{sentinel: s, msg: st.Message()}
	}
	return fmt.Errorf("rendezvous: %s: %s", st.Code(), st.Message())
}
