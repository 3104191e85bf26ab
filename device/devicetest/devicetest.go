// Package devicetest is an in-memory implementation of package device's
// interfaces, for tests: an Engine whose "device memory" is host memory
// outside the Go heap, whose work runs at once, and whose failures can be
// switched on; Buffers and StreamBuffers over it. Any test may import it,
// as wireguard-go's tests import tun/tuntest.
package devicetest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/dtype"
	"github.com/gccl/gccl/internal/reduce"
)

// Engine is a device.Engine over host memory: addresses are process
// addresses, a description carries the address and length, and Reduce and
// Copy run before they return. Set the fields before use.
type Engine struct {
	// EngineName is what Name returns.
	EngineName string
	// FailImport and FailExport make Import and AppendExport fail, as an
	// engine that cannot map a peer's memory or share its own would.
	FailImport, FailExport bool
	// WaitDelay is how long Wait sleeps.
	WaitDelay time.Duration

	// Counters of completed calls.
	Readies, Waits, Reduces, Copies atomic.Int64
}

var _ device.Engine = (*Engine)(nil)

// NewEngine returns an engine named name.
func NewEngine(name string) *Engine { return &Engine{EngineName: name} }

func (e *Engine) Name() string { return e.EngineName }

func (e *Engine) Ready() error {
	e.Readies.Add(1)
	return nil
}

// descLen is the length of the descriptions: address and length.
const descLen = 16

func (e *Engine) AppendExport(dst []byte, ptr uintptr, n int) ([]byte, error) {
	if e.FailExport {
		return nil, errors.New("devicetest: memory of another allocator, no IPC handle")
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(ptr))
	return binary.LittleEndian.AppendUint64(dst, uint64(n)), nil
}

func (e *Engine) Import(desc []byte, n int) (uintptr, error) {
	if e.FailImport {
		return 0, errors.New("devicetest: cannot map the peer's memory")
	}
	if len(desc) != descLen {
		return 0, fmt.Errorf("devicetest: a %d-byte description, want %d", len(desc), descLen)
	}
	if have := binary.LittleEndian.Uint64(desc[8:]); uint64(n) > have {
		return 0, fmt.Errorf("devicetest: %d bytes of a %d-byte export", n, have)
	}
	return uintptr(binary.LittleEndian.Uint64(desc)), nil
}

// Reduce computes the reduction with gccl's host kernels, every type and op
// as device.Reduce defines them.
func (e *Engine) Reduce(r *device.Reduce) error {
	if len(r.In) == 0 || len(r.Out) == 0 {
		return fmt.Errorf("devicetest: a reduction of %d inputs into %d outputs", len(r.In), len(r.Out))
	}
	n := r.Count * r.DataType.Size()
	if n <= 0 {
		return nil
	}
	acc := make([]byte, n) // outputs may alias inputs
	in := func(i int) []byte { return mem(r.In[i], n) }
	kop := reduce.Sum
	scaled, s := false, 0.0
	switch r.Op.Kind {
	case dtype.OpProd:
		kop = reduce.Prod
	case dtype.OpMin:
		kop = reduce.Min
	case dtype.OpMax:
		kop = reduce.Max
	case dtype.OpAvg:
		scaled, s = r.DataType.IsFloat(), 1/float64(r.Ranks)
	case dtype.OpPreMulSum:
		scaled, s = true, r.Op.Scalar
	}
	if scaled {
		reduce.Scale(r.DataType)(acc, in(0), s)
		for i := 1; i < len(r.In); i++ {
			reduce.Axpy(r.DataType)(acc, acc, in(i), s)
		}
	} else {
		copy(acc, in(0))
		for i := 1; i < len(r.In); i++ {
			reduce.Lookup(r.DataType, kop)(acc, acc, in(i))
		}
		if r.Op.Kind == dtype.OpAvg {
			reduce.Div(r.DataType)(acc, acc, r.Ranks)
		}
	}
	for _, o := range r.Out {
		copy(mem(o, n), acc)
	}
	e.Reduces.Add(1)
	return nil
}

func (e *Engine) Copy(dst, src uintptr, n int) error {
	copy(mem(dst, n), mem(src, n))
	e.Copies.Add(1)
	return nil
}

func (e *Engine) Wait() error {
	time.Sleep(e.WaitDelay)
	e.Waits.Add(1)
	return nil
}

// mem is the n bytes at address p.
func mem(p uintptr, n int) []byte { return unsafe.Slice((*byte)(unsafe.Add(nil, p)), n) }

// NopHold is a device.Hold that holds nothing.
type NopHold struct{}

func (NopHold) Ready() error { return nil }
func (NopHold) Release()     {}
