package comm

import (
	"unsafe"

	"github.com/gccl/gccl/device"
)

// The device seam's interfaces (package device), under comm's names.
type (
	// DeviceBuffer is a Buffer in memory the host cannot address (GPU
	// memory): its HostBytes is nil, and it copies its contents to and
	// from host memory. Package gpu provides them (allocated there, or
	// wrapping another framework's device pointer).
	//
	// A collective or Send/Recv on device buffers that are not
	// PeerDeviceBuffers (or that the devices cannot run, below) moves
	// their data through host memory: the inputs are copied to host
	// staging buffers, the operation runs on those, and the results are
	// copied back. It is correct everywhere and slow: every byte crosses
	// PCIe twice more than with NCCL. Passing the same DeviceBuffer as
	// send and receive buffer is an in-place call; sub-ranges of one
	// device buffer are not recognized as in place.
	DeviceBuffer = device.Buffer
	// PeerDeviceBuffer is a DeviceBuffer whose memory the ranks on its
	// host can reach directly (gpu.Buffer, through CUDA IPC). When every
	// rank of a single-host communicator passes them, every collective (an
	// in-place all-to-all excepted) runs on the devices: each rank reduces
	// or copies straight between the peers' device buffers with the
	// engine's kernels and copy engines, and nothing crosses to host
	// memory (devexec.go). A Send/Recv between two of them on one host is
	// one device-to-device copy by the receiver (sendrecv_device.go).
	PeerDeviceBuffer = device.PeerBuffer
	// DeviceEngine is a device's side of the device collectives (package
	// gpu implements it with CUDA).
	DeviceEngine = device.Engine
	// StreamBuffer is a DeviceBuffer bound to a device stream (gpu.Buffer's
	// OnStream; a CUDA stream of the caller's, or another framework's). A
	// call on StreamBuffers is ordered on their streams, as an NCCL call
	// is on its stream: it starts once the work queued on the streams
	// before it was issued is complete, and work queued on them after it
	// was issued, async form included, runs only once the call is
	// complete, on every rank. So the caller may queue kernels that
	// consume the results right after issuing the call, without waiting
	// for its Request. A call whose device buffers are StreamBuffers does
	// not wait for the rest of the device's work (DeviceEngine.Ready). The
	// device buffers of one call are all StreamBuffers or none is.
	StreamBuffer = device.StreamBuffer
	// StreamHold is a call's claim on a stream.
	StreamHold = device.Hold
	// DeviceStreamEngine is a DeviceEngine that can also queue a
	// collective's work on the caller's stream, with flags in host memory
	// that the devices wait on (package gpu's engine; RegisterDevice).
	DeviceStreamEngine = device.StreamEngine
	// DeviceReduce is one queued device reduction.
	DeviceReduce = device.Reduce
)

// MaxDeviceDescLen bounds DeviceEngine.AppendExport's descriptions.
const MaxDeviceDescLen = device.MaxDescLen

// stagedView returns the view of a device buffer. For a PeerDeviceBuffer
// its bytes are the device addresses (never touched from the host, but
// they let validation see in-place and overlapping buffers); stageIn gives
// it host staging only if the call does not run on the devices. Other
// device buffers get host staging of their size now.
func stagedView(db DeviceBuffer) (view, error) {
	if !db.DataType().Valid() {
		return view{}, invalid("unknown data type %v", db.DataType())
	}
	if db.Len() < 0 {
		return view{}, invalid("device buffer of %d elements", db.Len())
	}
	n := db.Len() * db.DataType().Size()
	if pb, ok := db.(PeerDeviceBuffer); ok && pb.Ptr() != 0 {
		return view{dt: db.DataType(), b: deviceBytes(pb.Ptr(), n), ok: true, dev: db, addr: true}, nil
	}
	return view{dt: db.DataType(), b: make([]byte, n), ok: true, dev: db}, nil
}

// deviceBytes is a slice over device addresses: the garbage collector
// ignores it (device memory is not in the Go heap), and nothing reads it.
func deviceBytes(p uintptr, n int) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(nil, p)), n)
}
