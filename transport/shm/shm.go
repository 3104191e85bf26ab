// Package shm connects ranks that are processes on one host through shared
// memory in /dev/shm.
//
// Each rank creates one segment, its mailbox, named gccl-<jobID>-<rank>. The
// mailbox holds a small header (magic, version, owner pid, the rank's state,
// its bell and a table of its rings) and, added as the rank first sends to
// each peer, one single-producer single-consumer ring of slots per peer it
// sends to. The sender writes its slots in place; the receiver maps the
// ring from the sender's mailbox and reads them in place, so a fused
// primitive can reduce straight from an incoming slot into an outgoing one.
// At Connect every rank maps only the headers of its local peers (it checks
// their state and rings their bells), so a job's shared memory grows with
// the pairs that talk, not with the square of the ranks on a host.
//
// The bell is a futex word in the rank's own header. A peer that commits a
// message or frees a slot rings it only when the rank sleeps, so the fast
// path is a few plain loads and one store per message, without system calls,
// locks or allocations. The same bell serves every transport of the process
// (Mailbox.Bell), so a rank can sleep until any of its peers, local or
// remote, makes progress.
//
// Shared memory gives no end-of-file, so a rank that waits checks now and
// then (at most every LivenessInterval) that its peers' processes still run,
// through pidfds, and fails the connections of a dead peer with a
// *transport.PeerError.
//
// A typical setup, with a bootstrap service to exchange names:
//
//	mb, err := shm.Create(jobID, rank, size, localPeers, shm.Config{})
//	// publish mb.Name() and os.Getpid(); gather the peers' ones
//	ep, err := mb.Connect(ctx, peers)
//	// barrier: every local peer has opened every mailbox
//	mb.Unlink()
//
// Regions (Alloc, MapRegion) are plain shared buffers with the same naming
// and permission rules, which peers map to read each other's data directly.
//
// The package works on Linux; elsewhere its constructors return
// ErrNotSupported.
package shm

import (
	"fmt"
	"time"

	"github.com/gccl/gccl/internal/errs"
	"github.com/gccl/gccl/internal/shmem"
)

// Defaults for Config. The slot size is the pipeline chunk of every
// collective that runs over shared memory. Between two processes on the
// development VM, slots of 64 KiB to 256 KiB and rings of 4 or 8 slots
// streamed and all-reduced alike (BenchmarkStream, BenchmarkAllReduce2 with
// GCCL_SHM_BENCH_ALL_GEOMETRIES=1); 32 KiB was slower. 128 KiB x 4 keeps a
// ring at 512 KiB; rings exist only between ranks that send to each other,
// so even eight ranks that all talk to all use 28 MiB of /dev/shm, under
// Docker's default 64 MiB.
const (
	DefaultSlotSize  = 128 << 10
	DefaultSlotCount = 4
	DefaultDir       = shmem.DefaultDir
)

// LivenessInterval is how often, at most, a waiting rank checks that its
// peers' processes are alive.
const LivenessInterval = 50 * time.Millisecond

// waitSlice bounds one futex sleep, so that context cancellation, the
// deadline and peer liveness are checked while a rank waits.
const waitSlice = 5 * time.Millisecond

// ErrNotSupported is returned on systems without the shared-memory
// transport.
var ErrNotSupported error = errs.New(errs.ErrNotSupported, "shm: shared-memory transport not supported on this system")

// Config sizes a mailbox. Every rank on a host must use the same SlotSize and
// SlotCount: Connect rejects a peer whose geometry differs.
type Config struct {
	// SlotSize is the largest message one slot carries (0: DefaultSlotSize).
	SlotSize int
	// SlotCount is the number of slots per ring, at least 2 (0:
	// DefaultSlotCount).
	SlotCount int
	// Dir is where segments are created (empty: DefaultDir).
	Dir string
}

// Peer is what a rank needs to know about a local peer: the name of its
// mailbox (Mailbox.Name) and its process id, which Connect checks against
// the mailbox header and uses to notice the peer's death. Pid 0 skips the
// check.
type Peer struct {
	Name string
	Pid  int
}

const (
	minSlotSize  = 64
	maxSlotSize  = 1 << 30
	minSlotCount = 2 // a fused receive-and-send holds one slot while it waits for the next
	maxSlotCount = 1 << 12
)

func (c Config) withDefaults() (Config, error) {
	if c.SlotSize == 0 {
		c.SlotSize = DefaultSlotSize
	}
	if c.SlotCount == 0 {
		c.SlotCount = DefaultSlotCount
	}
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	if c.SlotSize < minSlotSize || c.SlotSize > maxSlotSize {
		return c, fmt.Errorf("shm: slot size %d outside [%d, %d]", c.SlotSize, minSlotSize, maxSlotSize)
	}
	if c.SlotCount < minSlotCount || c.SlotCount > maxSlotCount {
		return c, fmt.Errorf("shm: slot count %d outside [%d, %d] (fused steps hold one slot while reserving the next)", c.SlotCount, minSlotCount, maxSlotCount)
	}
	return c, nil
}
