package comm

import (
	"context"
	"fmt"
)

// The staged path: a call on device buffers that the devices do not run
// (not PeerDeviceBuffers, a multi-host job, or the ranks agreed at
// arrival that they cannot) copies its device inputs to host staging,
// runs the host path on them, and copies the results back.

// runStaged runs a call through host staging.
func (c *Comm) runStaged(ctx context.Context, cl *call) error {
	if err := cl.stageIn(); err != nil {
		return c.opErr(cl, err)
	}
	var err error
	if cl.vkind != 0 {
		err = c.runV(ctx, cl)
	} else {
		err = c.runCollective(ctx, cl)
	}
	if err != nil {
		return err
	}
	return c.opErr(cl, cl.stageOut())
}

// runOnDevices runs a call on the devices (devexec.go), or through host
// staging when the ranks agree at arrival that the devices cannot.
func (c *Comm) runOnDevices(ctx context.Context, cl *call) error {
	handled, err := c.runDevice(ctx, cl)
	if handled {
		return c.opErr(cl, err)
	}
	return c.runStaged(ctx, cl)
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
		// A receive that went direct (sendrecv_device.go) kept its device view.
		if op := &ops[i]; op.v.dev != nil && op.recv && !op.v.addr {
			if err := op.v.dev.CopyFromHost(op.v.b); err != nil {
				return fmt.Errorf("copying a received device buffer back: %w", err)
			}
		}
	}
	return nil
}
