package p2p

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

func frame(h header, payload []byte) []byte {
	var b [wireHeaderLen]byte
	if payload != nil {
		h.length = uint64(len(payload))
	}
	putHeader(b[:], h)
	return append(b[:], payload...)
}

// FuzzPeerStream feeds arbitrary bytes to an agent's progress engine, as a
// connected peer would send them: whatever arrives, the agent neither
// panics, nor writes outside its registered region, nor hangs.
func FuzzPeerStream(f *testing.F) {
	a, err := New("target", Config{ListenAddr: "-", Logger: testLogger()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { a.Close() })
	mem := make([]byte, 3*4096)
	guardL, region, guardR := mem[:4096], mem[4096:8192], mem[8192:]
	r, err := a.RegisterMem(region)
	if err != nil {
		f.Fatal(err)
	}
	base := r.Addr()
	var seed []byte
	seed = append(seed, frame(header{op: opWrite, region: r.ID(), req: 1, offset: base + 10}, []byte("hello"))...)
	seed = append(seed, frame(header{op: opCommit, req: 1, flags: flagAck | flagNotify}, []byte("n"))...)
	f.Add(seed)
	f.Add(frame(header{op: opWrite, region: r.ID(), req: 2, offset: base + 4090}, []byte("past the end")))
	f.Add(frame(header{op: opWrite, region: 77, req: 2, offset: base}, []byte("no region")))
	f.Add(frame(header{op: opReadReq, region: r.ID(), req: 3, offset: base, length: 4096}, nil))
	f.Add(frame(header{op: opReadReq, region: r.ID(), req: 3, offset: base - 1, length: 2}, nil))
	f.Add(frame(header{op: opReadResp, req: 9, aux: 3, length: 5}, nil))
	f.Add(frame(header{op: opAck, req: 9, flags: flagError}, []byte("x")))
	f.Add(frame(header{op: opPing}, nil))
	f.Fuzz(func(t *testing.T, in []byte) {
		for i := range guardL {
			guardL[i], guardR[i] = 0xAA, 0xAA
		}
		ours, theirs := net.Pipe()
		info := &agentInfo{Name: "fuzzer"}
		p := newPeer(a, theirs, bufio.NewReader(theirs), info)
		a.mu.Lock()
		a.conns[p] = true
		a.wg.Add(2)
		a.mu.Unlock()
		go p.readLoop()
		go p.respond()
		drained := make(chan struct{})
		go func() { io.Copy(io.Discard, ours); close(drained) }()
		ours.SetWriteDeadline(time.Now().Add(2 * time.Second))
		ours.Write(in)
		ours.Close()
		select {
		case <-p.closed:
		case <-time.After(5 * time.Second):
			t.Fatal("the progress engine did not end after the stream closed")
		}
		<-drained
		for i := range guardL {
			if guardL[i] != 0xAA || guardR[i] != 0xAA {
				t.Fatal("a peer wrote outside the registered region")
			}
		}
	})
}
