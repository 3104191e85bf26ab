package transport

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Bell is how a rank sleeps until one of its connections changes state.
// Every transport serving a rank rings the rank's one Bell, so the rank can
// wait for all its peers at once whatever carries them: shared-memory peers
// in other processes ring it through a futex word, TCP reader goroutines
// ring it in-process. Doorbell is the in-process implementation.
type Bell interface {
	Seq() uint64
	Ring()
	// Wait sleeps until Seq differs from seen, ctx ends, the deadline
	// passes (ErrTimeout; zero means none) or the bell is closed
	// (ErrClosed). It may return early.
	Wait(ctx context.Context, seen uint64, deadline time.Time) error
	Close()
}

var _ Bell = (*Doorbell)(nil)

// Mux is one rank's Endpoint over several transports, each peer routed to
// the transport chosen for it at connection time (shm inside a host, tcp
// across hosts). All routes share the Mux's bell and slot size, so the
// executor's chunking is the same on every connection.
type Mux struct {
	rank, size int
	slotSize   int
	bell       Bell
	routes     []Endpoint // by peer; nil for self and unreachable peers
	subs       []Endpoint // distinct transports, closed with the Mux
}

// NewMux routes each peer to routes[peer]. Every route must have slot size
// slotSize and ring bell when its state changes.
func NewMux(rank, size, slotSize int, bell Bell, routes []Endpoint) (*Mux, error) {
	if len(routes) != size {
		return nil, fmt.Errorf("transport: %d routes for %d ranks", len(routes), size)
	}
	m := &Mux{rank: rank, size: size, slotSize: slotSize, bell: bell, routes: routes}
	seen := map[Endpoint]bool{}
	for p, ep := range routes {
		if ep == nil {
			continue
		}
		if ep.SlotSize() != slotSize {
			return nil, fmt.Errorf("transport: route to rank %d (%s) has slot size %d, want %d", p, ep.Name(), ep.SlotSize(), slotSize)
		}
		if !seen[ep] {
			seen[ep] = true
			m.subs = append(m.subs, ep)
		}
	}
	return m, nil
}

func (m *Mux) Rank() int     { return m.rank }
func (m *Mux) Size() int     { return m.size }
func (m *Mux) SlotSize() int { return m.slotSize }
func (m *Mux) Seq() uint64   { return m.bell.Seq() }

// Name lists the transports in use, e.g. "SHM+TCP".
func (m *Mux) Name() string {
	s := ""
	for i, ep := range m.subs {
		if i > 0 {
			s += "+"
		}
		s += ep.Name()
	}
	return s
}

// Via names the transport that carries traffic to peer.
func (m *Mux) Via(peer int) string {
	if peer < 0 || peer >= m.size || m.routes[peer] == nil {
		return "NONE"
	}
	return Via(m.routes[peer], peer)
}

// SetupFailure reports what the route to peer knows of a failed set-up.
func (m *Mux) SetupFailure(peer int) error {
	if peer < 0 || peer >= m.size || m.routes[peer] == nil {
		return nil
	}
	return SetupFailure(m.routes[peer], peer)
}

func (m *Mux) route(peer int) (Endpoint, error) {
	if peer < 0 || peer >= m.size || peer == m.rank {
		return nil, fmt.Errorf("transport: rank %d has no peer %d", m.rank, peer)
	}
	if m.routes[peer] == nil {
		return nil, &PeerError{Peer: peer, Err: errors.New("no transport reaches this peer")}
	}
	return m.routes[peer], nil
}

func (m *Mux) Sender(peer int) (Sender, error) {
	ep, err := m.route(peer)
	if err != nil {
		return nil, err
	}
	return ep.Sender(peer)
}

func (m *Mux) Receiver(peer int) (Receiver, error) {
	ep, err := m.route(peer)
	if err != nil {
		return nil, err
	}
	return ep.Receiver(peer)
}

// Wait lets every route that needs it prepare for the rank to sleep (TCP
// arms its background reader only then, so that a polling rank is not
// woken by every packet), then sleeps on the bell. Only one goroutine at a
// time may wait on an endpoint.
func (m *Mux) Wait(ctx context.Context, seen uint64, deadline time.Time) error {
	for _, ep := range m.subs {
		if p, ok := ep.(interface{ PrepareWait() }); ok {
			p.PrepareWait()
		}
	}
	return m.bell.Wait(ctx, seen, deadline)
}

func (m *Mux) Close() error {
	var first error
	for _, ep := range m.subs {
		if err := ep.Close(); err != nil && first == nil {
			first = err
		}
	}
	m.bell.Close()
	return first
}

func (m *Mux) Abort(err error) {
	for _, ep := range m.subs {
		ep.Abort(err)
	}
	m.bell.Close()
}

var _ Endpoint = (*Mux)(nil)
