// Package transport defines how gccl moves bytes between two ranks: slot
// rings that a sender fills in place and a receiver reads in place, so that a
// fused primitive can reduce straight from an incoming slot into an outgoing
// one. Implementations live in subpackages (inproc, and later shm, tcp,
// ibverbs, nvlink); the executor in package comm only sees these interfaces.
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
)

// Tag travels with every message so that a receiver can check that sender and
// receiver are in the same operation: the kind of operation in the top 8
// bits, a sequence number in the rest.
type Tag uint64

// MakeTag builds a tag from an operation kind and a sequence number.
func MakeTag(kind uint8, seq uint64) Tag { return Tag(uint64(kind)<<56 | seq&(1<<56-1)) }

// Kind returns the operation kind of the tag.
func (t Tag) Kind() uint8 { return uint8(t >> 56) }

// Seq returns the sequence number of the tag.
func (t Tag) Seq() uint64 { return uint64(t) & (1<<56 - 1) }

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
	ErrClosed = errors.New("transport: endpoint closed")
	// ErrPeerClosed is returned on a connection whose peer closed, aborted
	// or died.
	ErrPeerClosed = errors.New("transport: peer closed the connection")
	// ErrTimeout is returned by Wait when the deadline passes.
	ErrTimeout = errors.New("transport: timed out")
)

// PeerError reports a failure of the connection with one peer.
type PeerError struct {
	Peer int
	Err  error // ErrPeerClosed, possibly wrapping the peer's own abort reason
}

func (e *PeerError) Error() string { return fmt.Sprintf("peer rank %d: %v", e.Peer, e.Err) }
func (e *PeerError) Unwrap() error { return e.Err }

// Via names the transport that carries traffic from ep to peer ("INPROC",
// "SHM", "TCP"), for logs.
func Via(ep Endpoint, peer int) string {
	if v, ok := ep.(interface{ Via(int) string }); ok {
		return v.Via(peer)
	}
	return ep.Name()
}
