//go:build linux

package comm_test

import (
	"testing"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/device/devicetest"
	"github.com/gccl/gccl/internal/commtest"
)

// fakeDevMem is commtest.Mem on the fake GPU driver: PeerDeviceBuffers
// with device addresses, which the default path reduces on the devices
// (devexec.go).
type fakeDevMem struct {
	t   *testing.T
	eng *devicetest.Engine
}

type fakeDevBuf struct{ b *devicetest.Buffer }

func (m fakeDevMem) Load(dt comm.DataType, b []byte) (commtest.MemBuf, error) {
	buf := devicetest.NewBuffer(m.t, m.eng, dt, len(b)/dt.Size())
	return fakeDevBuf{buf}, buf.CopyFromHost(b)
}
func (d fakeDevBuf) Buffer() comm.Buffer          { return d.b }
func (d fakeDevBuf) Slice(off, n int) comm.Buffer { return d.b.View(off, n) }
func (d fakeDevBuf) Read(dst []byte) error        { return d.b.CopyToHost(dst) }

// TestDeterministicOnDeviceBuffers: the contract holds on device buffers
// of the fake GPU driver (staged through host memory), whose reductions
// the devices would otherwise run in an order of their own.
func TestDeterministicOnDeviceBuffers(t *testing.T) {
	for _, n := range []int{2, 3} {
		cs := world(t, n, &comm.Config{Deterministic: true, SlotSize: 256})
		opts := commtest.DetermOptions{
			Mem:   fakeDevMem{t, devicetest.NewEngine("fake")},
			Sizes: commtest.DetermSizes(cs[0], 256, 700),
		}
		mustAll(t, determCheck(t, cs, opts))
	}
}

// The fake driver's own reductions fold in rank order too (but scale with
// Axpy, one rounding fewer for bfloat16 and float16 than the contract's),
// so the check alone cannot tell which path ran: the engine's counter
// does. The devices reduce on the default path, never on the
// deterministic one.
func TestDeterministicBypassesDevices(t *testing.T) {
	for _, det := range []bool{false, true} {
		cs := world(t, 3, &comm.Config{Deterministic: det})
		eng := devicetest.NewEngine("fake")
		opts := commtest.DetermOptions{
			Mem:   fakeDevMem{t, eng},
			Types: []comm.DataType{comm.Float32}, Ops: []comm.Op{comm.Sum},
			Sizes: []int{5, 5000},
		}
		mustAll(t, determCheck(t, cs, opts))
		if got := eng.Reduces.Load(); det != (got == 0) {
			t.Fatalf("Deterministic %v: the devices ran %d reductions", det, got)
		}
	}
}
