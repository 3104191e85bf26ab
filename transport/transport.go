// Package transport defines how gccl moves bytes between two ranks: slot
// rings that a sender fills in place and a receiver reads in place, so that a
// fused primitive can reduce straight from an incoming slot into an outgoing
// one. Implementations live in subpackages (inproc for goroutines of one
// process; shm, tcp and the others register themselves as a Transport, and
// registry.go chooses one per pair of ranks); the executor in package comm
// only sees these interfaces.
//
// The interfaces are non-blocking: Try calls either make progress or report
// that the caller must wait. Waiting is the endpoint's job (Seq and Wait), so
// that one rank can wait for any of several connections at once, and so that
// each transport can sleep the way its medium allows (a channel in-process, a
// futex in shared memory, a poller on sockets).
package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gccl/gccl/internal/errs"
)

// Tag travels with every message so that a receiver can check that sender and
// receiver are in the same operation, with the same arguments: the kind of
// operation in the top 8 bits, then 16 bits of a check of the arguments that
// must agree between the ranks (count, type, op, root; a message's length),
// then a 40-bit sequence number. The check turns a count that differs
// between ranks into an error on the first message instead of a silent
// wrong answer when the chunks happen to line up.
type Tag uint64

const (
	seqBits   = 40
	checkBits = 16
	seqMask   = 1<<seqBits - 1
)

// MakeTag builds a tag from an operation kind and a sequence number (kept
// modulo 2^40), with a zero check.
func MakeTag(kind uint8, seq uint64) Tag { return Tag(uint64(kind)<<56 | seq&seqMask) }

// WithCheck returns t with its argument check set to check.
func (t Tag) WithCheck(check uint16) Tag {
	return t&^(Tag(1<<checkBits-1)<<seqBits) | Tag(check)<<seqBits
}

// Kind returns the operation kind of the tag.
func (t Tag) Kind() uint8 { return uint8(t >> 56) }

// Check returns the tag's argument check.
func (t Tag) Check() uint16 { return uint16(t >> seqBits) }

// Seq returns the sequence number of the tag (modulo 2^40).
func (t Tag) Seq() uint64 { return uint64(t) & seqMask }

// ArgCheck is the check of an operation over count elements (or bytes)
// whose other arguments agreed between ranks are packed in args. Counts are
// taken modulo the prime 65521, so two counts get different checks unless
// they differ by a multiple of it: counts off by a few chunks, by a factor
// below 65521 (twice, half), are always told apart; so are args that differ
// with the same count.
func ArgCheck(count uint64, args uint16) uint16 { return uint16(count%65521) ^ args }

// Sender is the sending half of a connection to one peer.
type Sender interface {
	// TryReserve returns the next free outgoing slot, n bytes long, or
	// ok == false when every slot is still in use by the receiver. n must
	// not exceed the endpoint's SlotSize.
	TryReserve(n int) (slot []byte, ok bool, err error)
	// Commit publishes the reserved slot, with the tag, to the receiver.
	Commit(tag Tag)
}

// Receiver is the receiving half of a connection from one peer.
type Receiver interface {
	// TryNext returns the oldest unreleased message, or ok == false when
	// none has arrived. The message stays valid until Release.
	TryNext() (msg []byte, tag Tag, ok bool, err error)
	// Release hands the oldest message's slot back to the sender.
	Release()
}

// RefSender is a Sender that can also send a message straight from the
// caller's memory, so that a large copy-only message skips the copy into a
// slot (transport/tcp: the kernel reads the caller's bytes).
type RefSender interface {
	Sender
	// TrySendRef queues p, at most SlotSize bytes, as the next message, or
	// reports ok == false when every slot is still in use. The transport
	// reads p until Flushed reports true or the endpoint is aborted: the
	// caller must neither change p nor return it to its own caller before.
	TrySendRef(p []byte, tag Tag) (ok bool, err error)
	// Flushed reports whether every message queued so far has left the
	// caller's memory, trying to write what remains first. A failed
	// connection reports its error.
	Flushed() (bool, error)
}

// PostReceiver is a Receiver that can land a message straight in the
// caller's memory instead of a slot.
type PostReceiver interface {
	Receiver
	// Post asks that the message ahead places after the oldest unreleased
	// one (0: that one) be read into p if it is len(p) bytes long. It
	// reports false when it cannot take the post (ahead beyond
	// PostWindow). A post is a hint: a message whose header arrived
	// before its post, or whose length differs, lands in a slot as usual.
	// TryNext returns the message where it landed, so a caller compares
	// the address rather than trusting the post. From Post until the
	// message is released, or the endpoint is closed or aborted, p belongs
	// to the transport. Post each message at most once.
	Post(ahead int, p []byte) bool
	// PostWindow is how many messages ahead Post accepts.
	PostWindow() int
}

// Endpoint is one rank's attachment to a set of peers.
type Endpoint interface {
	Rank() int
	Size() int
	// Name is the transport's name for logs ("INPROC", "SHM", "TCP").
	Name() string
	// SlotSize is the largest message one slot carries.
	SlotSize() int
	// Sender and Receiver return the connection halves to and from peer,
	// connecting on first use. Later calls return the same value.
	Sender(peer int) (Sender, error)
	Receiver(peer int) (Receiver, error)
	// Seq is a counter for Wait: read it before trying, pass it to Wait.
	// It need not change while the rank is awake (shared-memory peers only
	// ring a sleeping rank), so a caller must try again after every return
	// from Wait rather than compare Seq values to detect progress.
	Seq() uint64
	// Wait blocks until Seq differs from seen, ctx ends, the deadline passes
	// (zero means none) or the endpoint is closed. It may return early.
	// Only one goroutine at a time may wait on an endpoint (its owner).
	Wait(ctx context.Context, seen uint64, deadline time.Time) error
	// Close releases the endpoint; peers see ErrPeerClosed on connections
	// to it once they have drained what it sent.
	Close() error
	// Abort is Close after a failure: peers see ErrPeerClosed carrying err.
	Abort(err error)
}

var (
	// ErrClosed is returned by an endpoint that was closed or aborted.
	ErrClosed error = errs.New(errs.ErrClosed, "transport: endpoint closed")
	// ErrPeerClosed is returned on a connection whose peer closed, aborted
	// or died.
	ErrPeerClosed = errors.New("transport: peer closed the connection")
	// ErrTimeout is returned by Wait when the deadline passes.
	ErrTimeout error = errs.New(errs.ErrTimeout, "transport: timed out")
	// ErrConcurrentWait is returned by Wait when another goroutine is
	// already waiting on the same endpoint: only its owner may wait.
	ErrConcurrentWait error = errs.New(errs.ErrInvalidArgument, "transport: two goroutines wait on one endpoint at once (only its owner may)")
)

// PeerError reports a failure of the connection with one peer.
type PeerError struct {
	Peer int
	Err  error // ErrPeerClosed, possibly wrapping the peer's own abort reason
}

func (e *PeerError) Error() string { return fmt.Sprintf("peer rank %d: %v", e.Peer, e.Err) }
func (e *PeerError) Unwrap() error { return e.Err }

// SetupFailure reports why ep's connection with peer failed its set-up
// for good, when the transport knows (nil otherwise). A peer that then
// stops stopped on the same failure: it is the cause to report, not the
// lost peer.
func SetupFailure(ep Endpoint, peer int) error {
	if f, ok := ep.(interface{ SetupFailure(int) error }); ok {
		return f.SetupFailure(peer)
	}
	return nil
}

// Via names the transport that carries traffic from ep to peer ("INPROC",
// "SHM", "TCP"), for logs.
func Via(ep Endpoint, peer int) string {
	if v, ok := ep.(interface{ Via(int) string }); ok {
		return v.Via(peer)
	}
	return ep.Name()
}
