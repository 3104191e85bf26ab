// Package device is the seam between gccl's communicator and accelerator
// memory: the buffer interfaces a collective accepts for memory the host
// cannot address, and the Engine that runs a rank's share of a device
// collective. Package gpu implements them with CUDA; package comm uses them
// and re-exports them (comm.DeviceBuffer, comm.DeviceEngine, ...);
// devicetest is an in-memory implementation for tests.
package device

import "github.com/gccl/gccl/dtype"

// Buffer is memory the host cannot address (GPU memory): HostBytes is nil,
// and the buffer copies its contents to and from host memory.
type Buffer interface {
	// DataType is the element type.
	DataType() dtype.DataType
	// Len is the number of elements.
	Len() int
	// HostBytes is nil: the memory is not the host's.
	HostBytes() []byte
	// CopyToHost copies the whole buffer into dst (Len()*DataType().Size()
	// bytes) and returns once the copy is complete.
	CopyToHost(dst []byte) error
	// CopyFromHost copies src over the whole buffer and returns once the
	// copy is complete.
	CopyFromHost(src []byte) error
}

// PeerBuffer is a Buffer whose memory the ranks on its host can reach
// directly (through the Engine's exports, e.g. CUDA IPC).
type PeerBuffer interface {
	Buffer
	// Ptr is the buffer's device address, in the process's unified
	// address space.
	Ptr() uintptr
	// Engine runs the device work on the buffer's device.
	Engine() Engine
}

// StreamBuffer is a Buffer bound to a device stream. A call on
// StreamBuffers starts once the work queued on their streams before it was
// issued is complete, and the streams' later work runs only once the call
// is complete on every rank (as an NCCL call on its stream).
type StreamBuffer interface {
	Buffer
	// Stream identifies the buffer's stream: a call holds each stream once.
	Stream() uintptr
	// HoldStream claims the stream for a call being issued.
	HoldStream() (Hold, error)
}

// Hold is a call's claim on a stream: the stream's work queued after it
// waits until it is released.
type Hold interface {
	// Ready waits until the stream's work queued before the hold is
	// complete.
	Ready() error
	// Release lets the stream's later work run. The call is complete (or
	// failed) on every rank.
	Release()
}

// Engine is a device's side of the device collectives: it describes memory
// for peers, maps theirs, and queues reductions and copies.
type Engine interface {
	// Name says what the engine is, for the log.
	Name() string
	// Ready waits until work the caller queued before the collective
	// (producing its inputs, reading its outputs) is complete, since peers
	// read and write the buffers as soon as this rank arrives.
	Ready() error
	// AppendExport appends to dst a description of n bytes of device
	// memory at ptr for the peers' Import; the description fits in
	// MaxDescLen bytes. (Appending lets a call describe its buffers
	// without allocating.)
	AppendExport(dst []byte, ptr uintptr, n int) ([]byte, error)
	// Import returns the address in this process of n bytes a peer
	// exported, mapping and caching the peer's memory as needed.
	Import(desc []byte, n int) (uintptr, error)
	// Reduce queues out[j][i] = in[0][i] op ... op in[k-1][i] for every
	// output j and element i < count.
	Reduce(r *Reduce) error
	// Copy queues a copy of n bytes between device addresses.
	Copy(dst, src uintptr, n int) error
	// Wait waits until the queued work is complete.
	Wait() error
}

// Contender is an Engine that can tell when its device runs another
// process's work by turns rather than beside this one's (CUDA contexts of
// two processes on one GPU without MPS are time-sliced), so that every
// collective with device work on both waits for the device's time slices.
type Contender interface {
	// Contention describes the first such sharing the engine has seen
	// through Import, or returns "".
	Contention() string
}

// MaxDescLen bounds Engine.AppendExport's descriptions.
const MaxDescLen = 160

// Reduce is one queued device reduction. Avg divides by Ranks (float types
// pre-multiply each input by 1/Ranks; integer types divide the sum,
// truncating); PreMulSum multiplies each input by Op.Scalar.
type Reduce struct {
	DataType dtype.DataType
	Op       dtype.Op
	Ranks    int // the divisor of Avg
	Count    int
	In, Out  []uintptr
}

// FlagOp is one operation of StreamEngine.Flags on the 32-bit word at
// device address Addr: a store of Value, made once every write of the
// work queued on the stream before it is visible to the peers' devices and
// the host; or, with Wait, a wait until the word reaches Value, read as a
// wrapping counter: int32(word-Value) >= 0.
type FlagOp struct {
	Addr  uintptr
	Value uint32
	Wait  bool
}

// MaxFlagOps is the most operations one StreamEngine.Flags call takes (a
// CUDA driver takes fewer than 256 stream memory operations per batch).
const MaxFlagOps = 255

// StreamEngine is an Engine that also queues a collective's work on the
// caller's stream, where the device itself waits for its peers: each rank
// posts and waits for 32-bit flag words in host memory that every rank of
// the host maps (stream memory operations), so the host only queues the
// work and returns, with no host round and no wait for the device. Work on
// one stream runs in the order it was queued.
type StreamEngine interface {
	Engine
	// MapFlags makes host memory b (page-aligned memory from mmap, shared
	// with the peers, kept mapped until UnmapFlags) reachable by the
	// device's stream operations, and returns its device address.
	MapFlags(b []byte) (uintptr, error)
	// UnmapFlags undoes MapFlags; no work queued on a stream may still
	// use b.
	UnmapFlags(b []byte) error
	// Flags queues ops (at most MaxFlagOps) on stream s in their order,
	// in one submission where the device takes them so: a call's flag
	// operations cost the host one driver call, not one each.
	Flags(s uintptr, ops []FlagOp) error
	// ReduceOn queues r on stream s.
	ReduceOn(s uintptr, r *Reduce) error
	// CopyOn queues on stream s a copy of n bytes between device
	// addresses.
	CopyOn(s, dst, src uintptr, n int) error
	// Follow queues on stream s a wait for the work queued on stream prev
	// so far.
	Follow(s, prev uintptr) error
}
