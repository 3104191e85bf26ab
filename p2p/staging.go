package p2p

import (
	"fmt"
	"io"
	"unsafe"

	"github.com/gccl/gccl/internal/cuda"
)

// bounceSize is the size of each of a CUDA slot's two pinned bounce
// buffers: tcp and file transfers with a VRAM end are staged through them
// in chunks of this size, the copy of one chunk overlapping the socket or
// file work on the other.
const bounceSize = 4 << 20

// bounces returns the slot's pinned bounce buffers, allocating them once.
func (s *cudaSlot) bounces() ([2][]byte, error) {
	for i := range s.buf {
		if s.buf[i] != nil {
			continue
		}
		raw, err := s.ctx.AllocHost(bounceSize + directAlign)
		if err != nil {
			return s.buf, fmt.Errorf("p2p: pinned bounce buffer: %w", err)
		}
		skip := (directAlign - int(uintptr(unsafe.Pointer(&raw[0]))%directAlign)) % directAlign
		s.raw[i], s.buf[i] = raw, raw[skip:skip+bounceSize:skip+bounceSize]
	}
	return s.buf, nil
}

// fromDevice copies n bytes at src to the host through the bounce buffers
// and hands each chunk to out once it is there; the copy of the next chunk
// runs while out works on this one.
func (s *cudaSlot) fromDevice(src cuda.DevicePtr, n uint64, out func(off uint64, chunk []byte) error) error {
	if n == 0 {
		return nil
	}
	bufs, err := s.bounces()
	if err != nil {
		return err
	}
	queue := func(i int, off uint64) error {
		k := min(n-off, bounceSize)
		if err := s.ctx.CopyFromDeviceAsync(bufs[i%2][:k], src+cuda.DevicePtr(off), s.stream); err != nil {
			return err
		}
		return s.ctx.RecordEvent(s.ev[i%2], s.stream)
	}
	if err := queue(0, 0); err != nil {
		return err
	}
	for i, off := 0, uint64(0); off < n; i++ {
		k := min(n-off, bounceSize)
		if next := off + k; next < n {
			if err := queue(i+1, next); err != nil {
				s.wait(i % 2)
				return err
			}
		}
		if err := s.wait(i % 2); err != nil {
			return err
		}
		if err := out(off, bufs[i%2][:k]); err != nil {
			s.ctx.SyncStream(s.stream) // the next chunk's copy may still write its buffer
			return err
		}
		off += k
	}
	return nil
}

// toDevice fills bounce chunks with fill and copies them to n bytes at dst;
// the copy of one chunk runs while fill works on the next. A failed copy
// does not stop the filling (a connection's data must still be read to
// stay in step): devErr is the device's error, fillErr fill's.
func (s *cudaSlot) toDevice(dst cuda.DevicePtr, n uint64, fill func(off uint64, buf []byte) error) (devErr, fillErr error) {
	if n == 0 {
		return nil, nil
	}
	bufs, err := s.bounces()
	if err != nil {
		devErr = err
		var scratch [64 << 10]byte
		for off := uint64(0); off < n && fillErr == nil; {
			k := min(n-off, uint64(len(scratch)))
			fillErr = fill(off, scratch[:k])
			off += k
		}
		return devErr, fillErr
	}
	for i, off := 0, uint64(0); off < n; i++ {
		b := i % 2
		if i >= 2 && devErr == nil {
			devErr = s.wait(b) // the buffer's previous copy
		}
		k := min(n-off, bounceSize)
		if fillErr = fill(off, bufs[b][:k]); fillErr != nil {
			break
		}
		if devErr == nil {
			devErr = s.ctx.CopyToDeviceAsync(dst+cuda.DevicePtr(off), bufs[b][:k], s.stream)
		}
		if devErr == nil {
			devErr = s.ctx.RecordEvent(s.ev[b], s.stream)
		}
		off += k
	}
	if err := s.ctx.SyncStream(s.stream); devErr == nil {
		devErr = err
	}
	return devErr, fillErr
}

// toDeviceFrom lands n bytes read from rd at device address dst of device
// dev through pinned buffers (a tcp WRITE into a VRAM region, or a READ's
// data for local VRAM). All n bytes are read even when the device fails
// (devErr), so the connection stays in step; err is rd's.
func (g *gpuState) toDeviceFrom(rd io.Reader, dev int, dst, n uint64) (devErr, err error) {
	sl, devErr := g.slot(dev)
	if devErr != nil {
		_, err = io.CopyN(io.Discard, rd, int64(n))
		return devErr, err
	}
	defer g.put(sl)
	return sl.toDevice(cuda.DevicePtr(dst), n, func(_ uint64, buf []byte) error {
		_, err := io.ReadFull(rd, buf)
		return err
	})
}
