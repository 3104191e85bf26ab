package p2p

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestSpinGaugeRestore: a wait that slept but was answered soon gives the
// full budget back, so two sides that both stopped spinning start again.
func TestSpinGaugeRestore(t *testing.T) {
	var g spinGauge
	for b := g.budget(); b > 0; b = g.budget() {
		g.report(b, false)
	}
	g.restore()
	if b := g.budget(); b != spinMaxNs {
		t.Fatalf("budget after restore %d, want %d", b, spinMaxNs)
	}
}

// TestWaiterLeavesFramesToReader: a goroutine holding the reading role
// handles the frames it may (a ping), leaves the others (an RDMA barrier)
// and what follows them to the reader goroutine, and nudges it when it
// lets go: the reader, woken by those bytes while the role was held, would
// otherwise sleep until more bytes came.
func TestWaiterLeavesFramesToReader(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	c := fakeTargetTCP(t, a, 4096)
	a.mu.RLock()
	p := a.peers["fake"]
	a.mu.RUnlock()
	p.tc.want.Add(1)
	waitFor(t, func() bool { return p.tc.reading.CompareAndSwap(false, true) })

	send := func(h header) {
		var hb [wireHeaderLen]byte
		putHeader(hb[:], h)
		if _, err := c.Write(hb[:]); err != nil {
			t.Fatal(err)
		}
	}
	expectPong := func(aux uint64) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		h := readFrame(t, c)
		for h.op == opPing { // the agent's own keepalive
			h = readFrame(t, c)
		}
		if h.op != opPong || h.aux != aux {
			t.Fatalf("got %v %d, want pong %d", h.op, h.aux, aux)
		}
	}

	send(header{op: opPing, aux: 7})
	deadline := time.Now().Add(10 * time.Second)
	for {
		handled, leave := p.waiterFrame()
		if leave {
			t.Fatal("the waiter left a ping to the reader")
		}
		if handled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ping never arrived")
		}
	}
	expectPong(7)

	send(header{op: opRDMABarrier})
	send(header{op: opPing, aux: 8})
	for p.br.Buffered() < 2*wireHeaderLen {
		if _, err := p.pollFrames(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the frames never arrived")
		}
	}
	if handled, leave := p.waiterFrame(); handled || !leave {
		t.Fatalf("waiterFrame on an RDMA barrier: handled %v, leave %v", handled, leave)
	}
	time.Sleep(50 * time.Millisecond) // the reader wakes for the bytes, finds the role held, sleeps
	p.tc.want.Add(-1)
	p.releaseReading()
	expectPong(8)
}

// TestTCPWaitersBothWays: two agents post small and large WRITEs and
// READs to each other from several goroutines at once, each waiting for
// its own: waiters and readers pass the reading role around on both
// connections while frames of every kind cross, and every byte lands.
func TestTCPWaitersBothWays(t *testing.T) {
	a, b := pair(t, Config{DisableSHM: true, DisablePVM: true})
	const workers, slot = 3, 1 << 20
	iters := 150
	if testing.Short() {
		iters = 40
	}
	type side struct {
		ag     *Agent
		region []byte
		reg    *Region
	}
	sides := [2]*side{{ag: a}, {ag: b}}
	for _, s := range sides {
		s.region = make([]byte, 2*workers*slot)
		var err error
		if s.reg, err = s.ag.RegisterMem(s.region); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.LoadRemote(ctxT(t), a.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for si, s := range sides {
		peer := sides[1-si]
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Sources in the first half of a region, targets in the second.
				mine, theirs := uint64(w*slot), uint64((workers+w)*slot)
				for i := range iters {
					n := uint64(4096)
					if i%25 == 24 {
						n = slot
					}
					op := Write
					if i%2 == 1 {
						op = Read
					}
					local, remote := s.region[mine:mine+n], peer.region[theirs:theirs+n]
					if op == Write {
						fill(local, byte(i+w+si))
					} else {
						fill(remote, byte(i+w+si)) // nobody else touches the slot
					}
					var opts *RequestOptions
					if i%3 == 0 {
						opts = &RequestOptions{Notif: []byte("x")}
					}
					req, err := s.ag.CreateRequest(op, DescList{Type: DRAM, Descs: []Desc{s.reg.Desc(mine, n)}},
						peer.ag.Name(), DescList{Type: DRAM, Descs: []Desc{peer.reg.Desc(theirs, n)}}, opts)
					if err == nil && req.Backend() != BackendTCP {
						err = fmt.Errorf("backend %v", req.Backend())
					}
					if err == nil {
						_, err = req.Post()
					}
					if err == nil {
						err = req.Wait(ctxT(t))
					}
					if err == nil && !bytes.Equal(local, remote) {
						err = fmt.Errorf("%v of %d bytes: data differs", op, n)
					}
					if req != nil {
						req.Release()
					}
					if err != nil {
						errs <- fmt.Errorf("%s, worker %d, post %d: %w", s.ag.Name(), w, i, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
