package comm

import "fmt"

// DeviceBuffer is a Buffer in memory the host cannot address (GPU memory):
// its HostBytes is nil, and it copies its contents to and from host memory.
// Package gpu provides them (allocated there, or wrapping another
// framework's device pointer).
//
// Until gccl runs collectives on devices (CUDA IPC and reduction kernels),
// a collective or Send/Recv on device buffers moves their data through host
// memory: the inputs are copied to host staging buffers, the operation runs
// on those, and the results are copied back. It is correct everywhere and
// slow: every byte crosses PCIe twice more than with NCCL. Passing the same
// DeviceBuffer as send and receive buffer is an in-place call; sub-ranges
// of one device buffer are not recognized as in place.
type DeviceBuffer interface {
	Buffer
	// CopyToHost copies the whole buffer into dst (Len()*DataType().Size()
	// bytes) and returns once the copy is complete.
	CopyToHost(dst []byte) error
	// CopyFromHost copies src over the whole buffer and returns once the
	// copy is complete.
	CopyFromHost(src []byte) error
}

// stagedView returns the view of a device buffer: fresh host staging of its
// size, filled and drained around the operation (stageIn, stageOut).
func stagedView(db DeviceBuffer) (view, error) {
	if !db.DataType().Valid() {
		return view{}, invalid("unknown data type %v", db.DataType())
	}
	if db.Len() < 0 {
		return view{}, invalid("device buffer of %d elements", db.Len())
	}
	return view{dt: db.DataType(), b: make([]byte, db.Len()*db.DataType().Size()), ok: true, dev: db}, nil
}

// stageIn copies the device inputs of a call to their host staging. Output
// buffers are staged in too: ranks that do not write theirs (a non-root of
// Reduce or Gather) must leave them as they were, and staging out writes
// the whole buffer.
func (cl *call) stageIn() error {
	if cl.isGroup {
		return groupStageIn(cl.group)
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

func groupStageIn(ops []P2P) error {
	for i := range ops {
		if op := &ops[i]; op.v.dev != nil && !op.recv {
			if err := op.v.dev.CopyToHost(op.v.b); err != nil {
				return fmt.Errorf("staging a device send buffer: %w", err)
			}
		}
	}
	return nil
}

func groupStageOut(ops []P2P) error {
	for i := range ops {
		if op := &ops[i]; op.v.dev != nil && op.recv {
			if err := op.v.dev.CopyFromHost(op.v.b); err != nil {
				return fmt.Errorf("copying a received device buffer back: %w", err)
			}
		}
	}
	return nil
}
