package comm

import (
	"fmt"
	"reflect"
)

// Buffer is memory a collective reads or writes. Host buffers come from
// Host or Comm.Alloc; device buffers (GPU memory) implement DeviceBuffer.
type Buffer interface {
	// DataType is the element type.
	DataType() DataType
	// Len is the number of elements.
	Len() int
	// HostBytes is the memory as bytes, or nil when it is not host memory.
	HostBytes() []byte
}

// HostBuffer is a Buffer over a Go slice.
type HostBuffer struct {
	dt DataType
	b  []byte
}

// Host wraps a typed slice as a Buffer, without copying. Wrap once and reuse
// the Buffer: the conversion to the interface allocates.
func Host[T Scalar](s []T) *HostBuffer {
	return &HostBuffer{dt: TypeOf[T](), b: asBytes(s)}
}

// HostBytesOf wraps raw bytes holding elements of type dt.
func HostBytesOf(dt DataType, b []byte) *HostBuffer { return &HostBuffer{dt: dt, b: b} }

func (h *HostBuffer) DataType() DataType { return h.dt }
func (h *HostBuffer) HostBytes() []byte  { return h.b }
func (h *HostBuffer) Len() int {
	if s := h.dt.Size(); s > 0 {
		return len(h.b) / s
	}
	return 0
}

// view is the executor's form of a buffer argument: bytes plus type.
type view struct {
	dt DataType
	ok bool // false when the buffer is absent (nil)
	// addr: b spans dev's device addresses, not host memory; it must get
	// host staging (staging) before anything reads or writes it.
	addr bool
	b    []byte
	dev  DeviceBuffer // set when b is host staging for device memory
}

func viewOf[T Scalar](s []T) view {
	return view{dt: TypeOf[T](), b: asBytes(s), ok: s != nil}
}

func viewOfBuffer(b Buffer) (view, error) {
	if h, ok := b.(*HostBuffer); ok {
		// The common case, read without the interface's method calls:
		// every call of the Buffer forms pays this twice.
		if h == nil {
			return view{}, nil
		}
		return hostView(h.dt, h.b, h.Len())
	}
	if b == nil {
		return view{}, nil
	}
	if v := reflect.ValueOf(b); v.Kind() == reflect.Pointer && v.IsNil() {
		// A nil pointer of another Buffer type in the interface is as
		// absent as a nil Buffer; its methods would dereference it.
		return view{}, nil
	}
	hb := b.HostBytes()
	if hb == nil && b.Len() > 0 {
		if sb, ok := b.(*SymBuffer); ok && sb.HostBytes() == nil {
			return view{}, invalid("a SymBuffer used after Free")
		}
		if db, ok := b.(DeviceBuffer); ok {
			return stagedView(db)
		}
		return view{}, fmt.Errorf("%w: a buffer that is neither host memory nor a DeviceBuffer", ErrNotSupported)
	}
	return hostView(b.DataType(), hb, b.Len())
}

// hostView checks that hb holds n whole elements of dt.
func hostView(dt DataType, hb []byte, n int) (view, error) {
	if !dt.Valid() {
		return view{}, invalid("unknown data type %v", dt)
	}
	if len(hb) != n*dt.Size() {
		return view{}, invalid("buffer of %d bytes holds %d %v elements", len(hb), n, dt)
	}
	if hb == nil {
		hb = []byte{}
	}
	return view{dt: dt, b: hb, ok: true}, nil
}
