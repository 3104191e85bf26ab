//go:build unix

package devicetest

import (
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/dtype"
)

// Buffer is a device.PeerBuffer in memory outside the Go heap, as device
// memory is (checkptr rejects device views of Go memory).
type Buffer struct {
	mem []byte
	dt  dtype.DataType
	eng device.Engine
}

var _ device.PeerBuffer = (*Buffer)(nil)

// NewBuffer maps count zeroed elements of dt on eng, unmapped when t ends.
func NewBuffer(t testing.TB, eng device.Engine, dt dtype.DataType, count int) *Buffer {
	t.Helper()
	n := max(count*dt.Size(), 1)
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("devicetest: mapping %d bytes: %v", n, err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return &Buffer{mem: b[:count*dt.Size()], dt: dt, eng: eng}
}

// View is count elements of b from element off, sharing b's memory, on the
// same engine.
func (b *Buffer) View(off, count int) *Buffer {
	esz := b.dt.Size()
	return &Buffer{mem: b.mem[off*esz : (off+count)*esz], dt: b.dt, eng: b.eng}
}

// Bytes is the buffer's memory, for the test to fill and check.
func (b *Buffer) Bytes() []byte { return b.mem }

// Float32s is the memory of a Float32 buffer as a slice.
func (b *Buffer) Float32s() []float32 {
	if b.dt != dtype.Float32 {
		panic("devicetest: Float32s of a " + b.dt.String() + " buffer")
	}
	if len(b.mem) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b.mem[0])), len(b.mem)/4)
}

func (b *Buffer) DataType() dtype.DataType { return b.dt }
func (b *Buffer) Len() int                 { return len(b.mem) / b.dt.Size() }
func (b *Buffer) HostBytes() []byte        { return nil }
func (b *Buffer) Engine() device.Engine    { return b.eng }

// Ptr is the buffer's address (non-zero, for an empty buffer too).
func (b *Buffer) Ptr() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b.mem[:cap(b.mem)]))) }

func (b *Buffer) CopyToHost(dst []byte) error {
	copy(dst, b.mem)
	return nil
}

func (b *Buffer) CopyFromHost(src []byte) error {
	copy(b.mem, src)
	return nil
}

// StreamBuffer is a Buffer bound to a stream; it counts the holds taken on
// it, and HoldErr fails them.
type StreamBuffer struct {
	*Buffer
	StreamID uintptr
	HoldErr  error
	Holds    atomic.Int32
}

var _ device.StreamBuffer = (*StreamBuffer)(nil)

func (b *StreamBuffer) Stream() uintptr { return b.StreamID }

func (b *StreamBuffer) HoldStream() (device.Hold, error) {
	if b.HoldErr != nil {
		return nil, b.HoldErr
	}
	b.Holds.Add(1)
	return NopHold{}, nil
}
