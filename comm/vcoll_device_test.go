//go:build linux

package comm

import (
	"context"
	"fmt"
	"testing"

	"github.com/gccl/gccl/device/devicetest"
)

// stagedOnly is a DeviceBuffer without a device address (not a
// PeerDeviceBuffer): it can only be staged.
type stagedOnly struct{ b *devicetest.Buffer }

func (b stagedOnly) DataType() DataType            { return b.b.DataType() }
func (b stagedOnly) Len() int                      { return b.b.Len() }
func (b stagedOnly) HostBytes() []byte             { return nil }
func (b stagedOnly) CopyToHost(dst []byte) error   { return b.b.CopyToHost(dst) }
func (b stagedOnly) CopyFromHost(src []byte) error { return b.b.CopyFromHost(src) }

// TestVariableCollectivesOnDeviceBuffers: AllToAllV and AllGatherV take
// device buffers, with or without device addresses, in place or not, and
// move them through host staging.
func TestVariableCollectivesOnDeviceBuffers(t *testing.T) {
	if _, peer := Buffer(stagedOnly{}).(PeerDeviceBuffer); peer {
		t.Fatal("stagedOnly has a device address")
	}
	const n = 3
	// Rank s sends rank d (s+d)%3+1 elements: every total is 6.
	cnt := func(s, d int) int { return (s+d)%3 + 1 }
	val := func(s, d, i int) float32 { return float32(100*s + 10*d + i) }
	for _, form := range []string{"peer", "staged", "inplace"} {
		t.Run(form, func(t *testing.T) {
			send, recv := make([]*devicetest.Buffer, n), make([]*devicetest.Buffer, n)
			for r := range n {
				send[r], recv[r] = newFakeDevBuf(t, 6, fakeEngine()), newFakeDevBuf(t, 6, fakeEngine())
			}
			errs := runFakeRanks(t, n, func(c *Comm) error {
				r := c.Rank()
				sc, rc := make([]int, n), make([]int, n)
				off := 0
				for p := range n {
					sc[p], rc[p] = cnt(r, p), cnt(p, r)
					for i := range sc[p] {
						send[r].Float32s()[off+i] = val(r, p, i)
					}
					off += sc[p]
				}
				var s, d Buffer = send[r], recv[r]
				switch form {
				case "staged":
					s, d = stagedOnly{send[r]}, stagedOnly{recv[r]}
				case "inplace":
					d = s
				}
				if err := c.AllToAllV(context.Background(), s, sc, d, rc); err != nil {
					return err
				}
				out := recv[r]
				if form == "inplace" {
					out = send[r]
				}
				off = 0
				for p := range n {
					for i := range rc[p] {
						if got, want := out.Float32s()[off+i], val(p, r, i); got != want {
							return fmt.Errorf("all-to-all: block from %d element %d = %v, want %v", p, i, got, want)
						}
					}
					off += rc[p]
				}
				// AllGatherV: rank p contributes p+1 elements.
				counts := []int{1, 2, 3}
				mine := send[r].View(0, r+1)
				if form == "inplace" { // this rank's block of the receive buffer
					mine = recv[r].View(r*(r+1)/2, r+1)
				}
				for i := range mine.Float32s() {
					mine.Float32s()[i] = val(r, 0, i)
				}
				s, d = mine, recv[r]
				if form == "staged" {
					s, d = stagedOnly{mine}, stagedOnly{recv[r]}
				}
				if err := c.AllGatherV(context.Background(), s, d, counts); err != nil {
					return err
				}
				off = 0
				for p := range n {
					for i := range counts[p] {
						if got, want := recv[r].Float32s()[off+i], val(p, 0, i); got != want {
							return fmt.Errorf("all-gather: block of %d element %d = %v, want %v", p, i, got, want)
						}
					}
					off += counts[p]
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}
