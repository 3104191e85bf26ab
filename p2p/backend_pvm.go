package p2p

import (
	"fmt"
	"sync"
	"time"
)

// The pvm backend: the target's regions are on its heap on this host, and
// process_vm_readv reaches it (probed at LoadRemote): the kernel copies
// between the processes, one system call per 1024 pieces (per share of a
// large transfer, split as the copy pool splits a copy).
var pvmSpec = backendSpec{
	backend: pvmBackend{}, kind: BackendPVM, name: "pvm", inline: true, initiatorChecks: true,
	cost: costModel{fixed: 2 * time.Microsecond, perPiece: 100 * time.Nanosecond, perPart: 5 * time.Microsecond, bytesPerSec: 5e9},
}

type pvmBackend struct{}

func (pvmBackend) serves(pl placement) (bool, string) {
	if !pl.peerDRAM() || !pl.sameHost || !pl.pvm || pl.localType == VRAM {
		return false, ""
	}
	return true, "same host, heap regions, process_vm_writev permitted"
}

func (pvmBackend) prepare(*Request) error { return nil }

func (pvmBackend) run(r *Request) error { return r.runPVM() }

// probe checks at LoadRemote whether process_vm_readv reaches the peer (on
// this host; unless Config.DisablePVM), and says so when it does not.
func (ra *remoteAgent) probe() {
	a, info := ra.a, ra.info
	if a.cfg.DisablePVM {
		return
	}
	err := probePVM(int(info.Pid), info.Probe, info.Token[:])
	ra.pvm = err == nil
	if err != nil {
		a.log.Info("p2p process_vm_readv unusable with this peer; its heap regions go over tcp", "peer", info.Name, "err", err)
	}
}

// runPVM copies with process_vm_writev/readv, one system call per 1024
// pieces (per about copyMin bytes when large), until the post's deadline.
func (r *Request) runPVM() error {
	start := 0
	for i := range r.parts {
		if i > 0 && r.stop.stopped() {
			return r.halted()
		}
		ps := &r.parts[i]
		segs := r.segs[start:ps.end]
		local, remote := make([][]byte, len(segs)), make([]uint64, len(segs))
		for k := range segs {
			s := &segs[k]
			local[k], remote[k] = s.local.mem[s.loff:s.loff+s.n], s.raddr
		}
		if err := r.a.copy.pvmAll(int(r.ra.info.Pid), r.op == Write, local, remote, ps.bytes, &r.stop); err != nil {
			return fmt.Errorf("p2p: %v to %s: %w", r.op, r.peer, err)
		}
		if err := r.halted(); err != nil {
			return err
		}
		if err := r.notifyPart(i); err != nil {
			return err
		}
		start = ps.end
	}
	return nil
}

// pvmAll is pvmCopy in equal shares across the workers when the transfer is
// large (one core's process_vm_writev does not reach memory bandwidth), in
// calls of about copyMin bytes between which st may stop it.
func (p *copyPool) pvmAll(pid int, write bool, local [][]byte, remote []uint64, total uint64, st *stopper) error {
	if total < 2*copyMin {
		return pvmCopy(pid, write, local, remote)
	}
	if p.workers == 1 {
		return pvmBlocks(pid, write, local, remote, st)
	}
	lens := make([]int, len(local))
	for i := range local {
		lens[i] = len(local[i])
	}
	ls, rs := make([][][]byte, p.workers), make([][]uint64, p.workers)
	n := shares(lens, total, p.workers, func(sh, i, off, k int) {
		ls[sh], rs[sh] = append(ls[sh], local[i][off:off+k]), append(rs[sh], remote[i]+uint64(off))
	})
	var wg sync.WaitGroup
	var fe firstError
	tasks := make([]copyTask, n)
	for i := range tasks {
		tasks[i] = copyTask{done: &wg, fn: func() {
			if err := pvmBlocks(pid, write, ls[i], rs[i], st); err != nil {
				fe.set(err)
			}
		}}
	}
	p.dispatch(tasks)
	return fe.err
}

// pvmBlocks is pvmCopy in calls of about copyMin bytes (large pieces
// split), asking st before each call after the first whether to stop.
func pvmBlocks(pid int, write bool, local [][]byte, remote []uint64, st *stopper) error {
	var ls [][]byte
	var rs []uint64
	n, sent := 0, false
	for i, l := range local {
		addr := remote[i]
		for len(l) > 0 {
			if n == 0 && sent && st.stopped() {
				return nil
			}
			k := min(len(l), copyMin-n)
			ls, rs = append(ls, l[:k]), append(rs, addr)
			l, addr, n = l[k:], addr+uint64(k), n+k
			if n == copyMin {
				if err := pvmCopy(pid, write, ls, rs); err != nil {
					return err
				}
				ls, rs, n, sent = ls[:0], rs[:0], 0, true
			}
		}
	}
	if len(ls) == 0 {
		return nil
	}
	return pvmCopy(pid, write, ls, rs)
}
