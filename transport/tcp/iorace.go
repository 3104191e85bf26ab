//go:build race

package tcp

import "sync/atomic"

// ioOrder tells the race detector what the kernel guarantees: the bytes a
// socket delivers were read from the sender's memory before the receiver's
// read returns. A sender records its read of the buffers and then
// releases; a receiver acquires and then records its write.
var ioOrder atomic.Uint64

// raceSent records the kernel's read of hdr and payload, then releases.
func raceSent(hdr, payload []byte) {
	var tmp [4096]byte
	for _, b := range [2][]byte{hdr, payload} {
		for len(b) > 0 {
			b = b[copy(tmp[:], b):]
		}
	}
	ioOrder.Add(1)
}

// raceReceived acquires what every write before this read released, then
// records the kernel's write of p.
func raceReceived(p []byte) {
	ioOrder.Load()
	copy(p, p)
}
