package p2p

import (
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/cufile"
)

// GPUDirect Storage (Config.GDS): a VRAM<->FILE transfer calls cuFile,
// which moves the bytes between the file and device memory itself (by DMA
// where the file system and nvidia-fs allow, through its own staging
// elsewhere), instead of through the agent's pinned bounce buffers. The
// library is loaded once per agent and each file registered with it once,
// on first use; where either fails the transfer bounces, and the agent
// says why once.

// gdsFile is a file region's registrations with cuFile: its O_DIRECT
// descriptor, which blocks aligned to directAlign in file and memory take
// (the direct path needs O_DIRECT), and its buffered one, which the rest
// take, as the bounce path does.
type gdsFile struct {
	direct, buffered gdsReg
}

// gdsReg is one descriptor's registration, made once on first use.
type gdsReg struct {
	once sync.Once
	lib  *cufile.Library // set once registered
	h    cufile.Handle
	err  error
}

func (g *gdsReg) handle(lib *cufile.Library, f *os.File) (cufile.Handle, error) {
	g.once.Do(func() {
		if g.h, g.err = lib.Register(int(f.Fd())); g.err == nil {
			g.lib = lib
		}
	})
	return g.h, g.err
}

func (g *gdsReg) deregister() {
	if g.lib != nil {
		g.lib.Deregister(g.h)
		g.lib = nil
	}
}

// handle returns the registration a transfer of n bytes at file offset off
// and device address ptr takes.
func (g *gdsFile) handle(lib *cufile.Library, fh *fileHandle, off, n uint64, ptr cuda.DevicePtr) (cufile.Handle, error) {
	if fh.direct != nil && off%directAlign == 0 && n%directAlign == 0 && uint64(ptr)%directAlign == 0 {
		return g.direct.handle(lib, fh.direct)
	}
	return g.buffered.handle(lib, fh.f)
}

// deregister drops the registrations; no transfer may be running.
func (g *gdsFile) deregister() {
	g.direct.deregister()
	g.buffered.deregister()
}

// cufile loads the library on first use.
func (g *gpuState) cufile() (*cufile.Library, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, ErrClosed
	}
	if !g.gdsLoaded {
		g.gdsLoaded = true
		if g.gds, g.gdsErr = cufile.Load(); g.gdsErr == nil {
			g.log.Info("p2p: VRAM<->FILE transfers go through cuFile (GPUDirect Storage)")
		}
	}
	return g.gds, g.gdsErr
}

// gdsVRAM moves segment s between local VRAM and the file with cuFile. It
// reports done=false, having moved nothing, when cuFile cannot take the
// transfer (no library, a file it refuses): the caller bounces it.
func (r *Request) gdsVRAM(s *segment) (done bool, err error) {
	g := &r.a.gpu
	ptr := cuda.DevicePtr(s.local.info.Base + s.loff)
	lib, err := g.cufile()
	var h cufile.Handle
	if err == nil {
		h, err = s.rreg.file.gds.handle(lib, s.rreg.file, s.raddr, s.n, ptr)
	}
	if err != nil {
		if _, seen := r.a.logged.LoadOrStore("gds/"+s.rreg.file.path, true); !seen {
			r.a.log.Warn("p2p: GDS asked for, but VRAM<->FILE transfers of this file bounce through pinned host memory", "file", s.rreg.file.path, "err", err)
		}
		return false, nil
	}
	ctx, err := g.context(s.local.vram.dev)
	if err != nil {
		return true, fmt.Errorf("p2p: %v of VRAM and a file: %w", r.op, err)
	}
	err = ctx.Do(func() error {
		// cuFile works on the calling thread's context; it may move
		// fewer bytes than asked (a read at the end of the file).
		for off := uint64(0); off < s.n; {
			var n int
			var err error
			if r.op == Write {
				n, err = lib.Write(h, ptr+cuda.DevicePtr(off), int(s.n-off), int64(s.raddr+off))
			} else {
				n, err = lib.Read(h, ptr+cuda.DevicePtr(off), int(s.n-off), int64(s.raddr+off))
			}
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("%d of %d bytes moved: %w", off, s.n, io.ErrUnexpectedEOF)
			}
			off += uint64(n)
		}
		return nil
	})
	if err != nil {
		return true, fmt.Errorf("p2p: %v of VRAM and a file through cuFile: %w", r.op, err)
	}
	return true, nil
}
