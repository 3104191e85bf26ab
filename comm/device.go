package comm

import (
	"fmt"
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
	// one device-to-device copy by the receiver (devp2p.go).
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

// staging gives an addressed device view host staging of its size.
func (v *view) staging() {
	if v.addr {
		v.b, v.addr = make([]byte, len(v.b)), false
	}
}

// stageIn copies the device inputs of a call to their host staging. Output
// buffers are staged in too: ranks that do not write theirs (a non-root of
// Reduce or Gather) must leave them as they were, and staging out writes
// the whole buffer.
func (cl *call) stageIn() error {
	shared := cl.out.dev != nil && cl.out.dev == cl.in.dev
	cl.in.staging()
	if shared {
		cl.out = cl.in
	}
	cl.out.staging()
	if cl.holds.n == 0 {
		// As on the devices (runDevice), the call's input is the work
		// queued before it on any stream, which the copies below (on the
		// legacy default stream) would not wait for. Held streams were
		// waited for already (run).
		if err := readyEngines(cl.in.dev, cl.out.dev); err != nil {
			return fmt.Errorf("waiting for the work queued on the device: %w", err)
		}
	}
	if cl.in.dev != nil {
		if err := cl.in.dev.CopyToHost(cl.in.b); err != nil {
			return fmt.Errorf("staging the device send buffer: %w", err)
		}
	}
	if cl.out.dev != nil && cl.out.dev != cl.in.dev {
		if err := cl.out.dev.CopyToHost(cl.out.b); err != nil {
			return fmt.Errorf("staging the device receive buffer: %w", err)
		}
	}
	return nil
}

// readyEngines waits for the work queued on the devices of a and b that
// have engines (DeviceEngine.Ready), each once; other device buffers have
// no way to wait.
func readyEngines(a, b DeviceBuffer) error {
	ea, eb := peerEngine(a), peerEngine(b)
	if ea != nil {
		if err := ea.Ready(); err != nil {
			return err
		}
	}
	if eb != nil && eb != ea {
		return eb.Ready()
	}
	return nil
}

// peerEngine is b's engine, or nil when b has none (not a PeerDeviceBuffer).
func peerEngine(b DeviceBuffer) DeviceEngine {
	if pb, ok := b.(PeerDeviceBuffer); ok {
		return pb.Engine()
	}
	return nil
}

// stageOut copies the results of a call from host staging to the device.
func (cl *call) stageOut() error {
	if cl.isGroup {
		return groupStageOut(cl.group)
	}
	if cl.out.dev != nil {
		if err := cl.out.dev.CopyFromHost(cl.out.b); err != nil {
			return fmt.Errorf("copying the device receive buffer back: %w", err)
		}
	}
	return nil
}

// hasDevice reports whether a call needs staging.
func (cl *call) hasDevice() bool {
	if cl.isGroup {
		return groupHasDevice(cl.group)
	}
	return cl.in.dev != nil || cl.out.dev != nil
}

func groupHasDevice(ops []P2P) bool {
	for i := range ops {
		if ops[i].v.dev != nil {
			return true
		}
	}
	return false
}

func groupStageOut(ops []P2P) error {
	for i := range ops {
		// A receive that went direct (devp2p.go) kept its device view.
		if op := &ops[i]; op.v.dev != nil && op.recv && !op.v.addr {
			if err := op.v.dev.CopyFromHost(op.v.b); err != nil {
				return fmt.Errorf("copying a received device buffer back: %w", err)
			}
		}
	}
	return nil
}
