package p2p

import (
	"fmt"
	"time"

	"github.com/gccl/gccl/internal/cuda"
)

// The file backend: the target is a FILE region of this agent. pread and
// pwrite run on the file pool (FileQueueDepth goroutines, FileBlockSize
// blocks, O_DIRECT where aligned); a VRAM end is staged through pinned
// bounce buffers, or moved by cuFile (Config.GDS).
var fileSpec = backendSpec{
	backend: fileBackend{}, kind: BackendFile, name: "file",
	cost: costModel{fixed: 20 * time.Microsecond, perPiece: 2 * time.Microsecond, bytesPerSec: 1e9},
}

type fileBackend struct{}

func (fileBackend) serves(pl placement) (bool, string) {
	if !pl.self || pl.remoteType != FILE {
		return false, ""
	}
	why := "target is a file of this agent"
	if pl.vram() {
		why += "; VRAM staged through pinned bounce buffers"
	}
	return true, why
}

func (fileBackend) prepare(*Request) error { return nil }

func (fileBackend) run(r *Request) error { return r.runFile() }

// runFile is the file backend: this agent's memory to or from its file,
// until the post's deadline (checked between blocks, pieces and parts).
func (r *Request) runFile() error {
	start := 0
	for i := range r.parts {
		if i > 0 && r.stop.stopped() {
			return r.halted()
		}
		ps := &r.parts[i]
		segs := r.segs[start:ps.end]
		// Pieces go to the pool by file handle; a request may span files.
		byFile := map[*fileHandle]int{}
		var mems [][][]byte
		var offs [][]int64
		var hs []*fileHandle
		for k := range segs {
			s := &segs[k]
			if s.local.vram != nil {
				if r.stop.stopped() { // a cuFile call is not cut in blocks
					return r.halted()
				}
				if err := r.fileVRAM(s); err != nil {
					return err
				}
				continue
			}
			j, ok := byFile[s.rreg.file]
			if !ok {
				j = len(hs)
				byFile[s.rreg.file] = j
				hs = append(hs, s.rreg.file)
				mems, offs = append(mems, nil), append(offs, nil)
			}
			mems[j] = append(mems[j], s.local.mem[s.loff:s.loff+s.n])
			offs[j] = append(offs[j], int64(s.raddr))
		}
		for j, h := range hs {
			if err := r.a.files.run(h, r.op == Write, mems[j], offs[j], &r.stop); err != nil {
				return err
			}
			if err := r.halted(); err != nil {
				return err
			}
		}
		if err := r.notifyPart(i); err != nil {
			return err
		}
		start = ps.end
	}
	return nil
}

// fileVRAM moves segment s between local VRAM and this agent's file
// through the slot's pinned buffers, in bounceSize chunks: the file I/O of
// one chunk (on the file pool, FileQueueDepth blocks at once) overlaps the
// device copy of the next.
func (r *Request) fileVRAM(s *segment) error {
	if r.a.cfg.GDS {
		if done, err := r.gdsVRAM(s); done {
			return err
		}
	}
	sl, err := r.a.gpu.slot(s.local.vram.dev)
	if err != nil {
		return fmt.Errorf("p2p: %v of VRAM and a file: %w", r.op, err)
	}
	defer r.a.gpu.put(sl)
	ptr, h := cuda.DevicePtr(s.local.info.Base+s.loff), s.rreg.file
	// run stops at the post's deadline between file blocks; halted then
	// ends the chunks. Both copy loops wait for their device copies
	// before returning.
	if r.op == Write {
		return sl.fromDevice(ptr, s.n, func(off uint64, chunk []byte) error {
			if err := r.a.files.run(h, true, [][]byte{chunk}, []int64{int64(s.raddr + off)}, &r.stop); err != nil {
				return err
			}
			return r.halted()
		})
	}
	devErr, err := sl.toDevice(ptr, s.n, func(off uint64, buf []byte) error {
		if err := r.a.files.run(h, false, [][]byte{buf}, []int64{int64(s.raddr + off)}, &r.stop); err != nil {
			return err
		}
		return r.halted()
	})
	if err != nil {
		return err
	}
	return devErr
}
