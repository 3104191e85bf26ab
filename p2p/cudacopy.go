package p2p

import (
	"errors"
	"fmt"

	"github.com/gccl/gccl/internal/cuda"
)

// cend is one end of a CUDA copy: host memory or a device address.
type cend struct {
	host []byte
	dev  cuda.DevicePtr
}

// copy queues n bytes from src to dst on the slot's stream.
func (s *cudaSlot) copy(dst, src cend, n int) error {
	switch {
	case dst.host == nil && src.host == nil:
		return s.ctx.CopyAsync(dst.dev, src.dev, n, s.stream)
	case dst.host == nil:
		return s.ctx.CopyToDeviceAsync(dst.dev, src.host[:n], s.stream)
	case src.host == nil:
		return s.ctx.CopyFromDeviceAsync(dst.host[:n], src.dev, s.stream)
	}
	copy(dst.host[:n], src.host[:n])
	return nil
}

// localEnd is the initiator's end of segment s.
func (s *segment) localEnd() cend {
	if s.local.vram != nil {
		return cend{dev: cuda.DevicePtr(s.local.info.Base + s.loff)}
	}
	return cend{host: s.local.mem[s.loff : s.loff+s.n]}
}

// remoteEnd is the target's end of segment s, as seen here: this agent's
// region, a peer's shared segment or a peer's VRAM opened through IPC.
func (s *segment) remoteEnd() cend {
	ro := s.raddr - s.rinfo.Base
	if s.rinfo.Type == VRAM {
		return cend{dev: cuda.DevicePtr(s.rdev + ro)}
	}
	return cend{host: s.rmem[ro : ro+s.n]}
}

// cudaDev is the device whose stream copies segment s: the local VRAM's,
// else the remote VRAM's here.
func (s *segment) cudaDev() int {
	if s.local.vram != nil {
		return s.local.vram.dev
	}
	return s.rctxDev
}

// hasVRAM reports whether either end of the request is VRAM: the backends
// where the initiator copies then copy through the driver.
func (r *Request) hasVRAM() bool { return r.local.typ == VRAM || r.remote.typ == VRAM }

// prepareCUDA loads what a request's CUDA copies need once, at
// MakeRequest: the driver, and pinned host memory for its DRAM ends.
func (r *Request) prepareCUDA() error {
	if err := r.a.gpu.available(); err != nil {
		return fmt.Errorf("p2p: %v of VRAM: %w", r.op, err)
	}
	for i := range r.segs {
		s := &r.segs[i]
		dev := s.cudaDev()
		if s.local.vram == nil {
			s.local.pinHost(dev)
		}
		switch {
		case s.rreg != nil && s.rreg.vram == nil:
			s.rreg.pinHost(dev)
		case !r.self && s.rinfo.Type == DRAM && r.ra != nil:
			r.ra.pinMapped(s.rinfo.ID, dev)
		}
	}
	return nil
}

// pinHost pins a DRAM region for CUDA copies, once; deregistration unpins.
func (r *Region) pinHost(dev int) {
	if r.mem != nil && r.pinned.CompareAndSwap(false, true) {
		r.a.gpu.pin(r.mem, dev)
	}
}

// runCUDA is the local, shm and cudaipc backends when an end is VRAM: every
// piece of a part is queued on a stream (one per device), then one event
// per stream is waited for before the part's notification.
func (r *Request) runCUDA() error {
	var slots []*cudaSlot
	defer func() {
		for _, s := range slots {
			r.a.gpu.put(s)
		}
	}()
	slotFor := func(dev int) (*cudaSlot, error) {
		for _, s := range slots {
			if s.dev == dev {
				return s, nil
			}
		}
		s, err := r.a.gpu.slot(dev)
		if err != nil {
			return nil, err
		}
		slots = append(slots, s)
		return s, nil
	}
	start := 0
	for i := range r.parts {
		ps := &r.parts[i]
		var err error
		for k := start; k < ps.end && err == nil; k++ {
			// Before each piece, not within one: a copy queued runs to its
			// end, and the fence below waits for it before any report.
			if (i > 0 || k > 0) && r.stop.stopped() {
				err = r.halted()
				break
			}
			s := &r.segs[k]
			var sl *cudaSlot
			if sl, err = slotFor(s.cudaDev()); err != nil {
				break
			}
			l, rm := s.localEnd(), s.remoteEnd()
			if r.op == Write {
				err = sl.copy(rm, l, int(s.n))
			} else {
				err = sl.copy(l, rm, int(s.n))
			}
		}
		for _, sl := range slots {
			if e := sl.fence(); err == nil {
				err = e
			}
		}
		if errors.Is(err, ErrTimeout) || errors.Is(err, ErrClosed) {
			return err
		}
		if err != nil {
			return fmt.Errorf("p2p: %v to %s: CUDA copy: %w", r.op, r.peer, err)
		}
		if err := r.notifyPart(i); err != nil {
			return err
		}
		start = ps.end
	}
	return nil
}
