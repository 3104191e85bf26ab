package tcp

import (
	"bytes"
	"testing"

	"github.com/gccl/gccl/transport"
)

// Connections hold slot memory only once a message needs it: a rank that
// sends to one peer of three holds that peer's send slots, the receiver
// that peer's receive slots, and nobody holds slots for pairs that never
// talked, nor for a message sent from the caller's memory into a posted
// buffer.
func TestSlotsMadeOnFirstUse(t *testing.T) {
	const slotSize, slotCount = 64 << 10, 4
	eps := connectWorld(t, 3, testConfig(slotSize, slotCount, 2))
	fixed := make([]int64, 3)
	for r, e := range eps {
		fixed[r] = e.MemStats().Heap
	}
	slots := int64(slotSize * slotCount)

	send(t, eps[0], 1, pattern(0, 1, 100), 5)
	if m, _ := recv(t, eps[1], 0); !bytes.Equal(m, pattern(0, 1, 100)) {
		t.Fatal("wrong message")
	}
	want := []int64{fixed[0] + slots, fixed[1] + slots, fixed[2]}
	for r, e := range eps {
		if got := e.MemStats().Heap; got != want[r] {
			t.Errorf("rank %d after one message 0 -> 1: %d bytes, want %d", r, got, want[r])
		}
	}

	// From the caller's memory into a posted buffer: 2 -> 1 makes none.
	s, _ := eps[2].Sender(1)
	r, _ := eps[1].Receiver(2)
	dst := make([]byte, slotSize)
	if !r.(transport.PostReceiver).Post(0, dst) {
		t.Fatal("post refused")
	}
	msg := pattern(2, 1, slotSize)
	for ok := false; !ok; {
		var err error
		if ok, err = s.(transport.RefSender).TrySendRef(msg, 6); err != nil {
			t.Fatal(err)
		}
	}
	var m []byte
	for ok := false; !ok; {
		var err error
		if m, _, ok, err = r.TryNext(); err != nil {
			t.Fatal(err)
		}
	}
	if &m[0] != &dst[0] || !bytes.Equal(dst, msg) {
		t.Fatal("the posted message did not land in its buffer")
	}
	r.Release()
	for r, e := range eps {
		if got := e.MemStats().Heap; got != want[r] {
			t.Errorf("rank %d after a posted message 2 -> 1: %d bytes, want %d", r, got, want[r])
		}
	}
}
