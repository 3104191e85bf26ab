// Package errs holds the identities of the errors every gccl package
// shares: not supported, invalid argument, closed and timed out. Each public
// package re-exports the ones it returns, under its own text
// (comm.ErrNotSupported says "gccl: not supported", topo's says what topology
// detection lacks), and errors.Is treats every sentinel of one kind as the
// same error: errors.Is(err, comm.ErrNotSupported) holds for gpu.Open's,
// p2p's and topo's "not supported" alike.
package errs

import "fmt"

// Sentinel is an error of one kind with a package's own text. Two sentinels
// of the same kind match each other in errors.Is, whichever is the target.
type Sentinel struct {
	kind *Sentinel // the kind's own sentinel; nil for a kind
	text string
}

func (s *Sentinel) Error() string { return s.text }

// Is reports whether target is a sentinel of the same kind.
func (s *Sentinel) Is(target error) bool {
	t, ok := target.(*Sentinel)
	return ok && t.root() == s.root()
}

func (s *Sentinel) root() *Sentinel {
	if s.kind == nil {
		return s
	}
	return s.kind
}

// New returns a sentinel of kind with its own text (a package's
// re-export).
func New(kind *Sentinel, text string) *Sentinel { return &Sentinel{kind: kind.root(), text: text} }

// The kinds.
var (
	// ErrNotSupported: the hardware, driver, system call or feature is
	// absent here.
	ErrNotSupported = &Sentinel{text: "gccl: not supported"}
	// ErrInvalidArgument: the caller's arguments are wrong; nothing
	// happened.
	ErrInvalidArgument = &Sentinel{text: "gccl: invalid argument"}
	// ErrClosed: the object was closed (or aborted) before or during the
	// call.
	ErrClosed = &Sentinel{text: "gccl: closed"}
	// ErrTimeout: the call did not complete within its time limit.
	ErrTimeout = &Sentinel{text: "gccl: timed out"}
)

// Errorf returns an error of kind whose text is the formatted message (for
// an error that carries its own reason rather than wrapping another).
func Errorf(kind *Sentinel, format string, args ...any) error {
	return &Sentinel{kind: kind.root(), text: fmt.Sprintf(format, args...)}
}
