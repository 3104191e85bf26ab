package comm

import (
	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/internal/clock"
	"github.com/gccl/gccl/transport"
)

// Hooks for the external tests.

// SymMinBytes is the smallest all-reduce that takes the symmetric path.
const SymMinBytes = symMinBytes

// SymNTMinBytes is the smallest all-reduce written with non-temporal stores.
const SymNTMinBytes = symNTMinBytes

// Busy reports whether an operation issued on the caller's goroutine runs
// on c.
func Busy(c *Comm) bool { return c.busy.Load() }

// SymOps counts the symmetric-memory all-reduces c has run.
func SymOps(c *Comm) uint64 { return c.symOps.Load() }

// SetHosts places in-process ranks on pretend hosts, so the hierarchical
// schedules run in the in-process tests.
func SetHosts(cs []*Comm, hostOf []string) {
	for _, c := range cs {
		c.setHosts(hostOf)
	}
}

// Algo is the algorithm c would run a collective of the given size with.
func Algo(c *Comm, coll string, bytes int) string {
	for k := algo.AllReduce; k <= algo.Scatter; k++ {
		if k.String() == coll {
			return c.choose(k, bytes, false).String()
		}
	}
	return "?"
}

// SetRingOrder lays the rings of in-process ranks over the ranks in order.
func SetRingOrder(cs []*Comm, order []int) error {
	for _, c := range cs {
		if err := c.setRingOrder(order); err != nil {
			return err
		}
	}
	return nil
}

// WallNow is the clock arrival times are read from.
var WallNow = clock.Now

// PendingShrinks counts the in-process shrinks of c's group still on record.
func PendingShrinks(c *Comm) int {
	g := c.rv.(*localRendezvous).g
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.shrinks)
}

// CMAMinBytes is the smallest broadcast output, and CMAMinGatherBytes the
// smallest all-gather output, c reads straight from peers' memory (the
// first is the larger).
func CMAMinBytes(c *Comm) int       { return c.cma.minBytes }
func CMAMinGatherBytes(c *Comm) int { return c.cma.minGather }

// CMASplitMinBytes is the smallest 2-process broadcast that splits.
const CMASplitMinBytes = cmaSplitMinBytes

// CMAOps counts the calls c ran on the single-copy path.
func CMAOps(c *Comm) uint64 { return c.cma.ops.Load() }

// CMASplits reports how many broadcasts the Comm ran with the root writing
// part of the reader's output.
func CMASplits(c *Comm) uint64 { return c.cma.splits.Load() }

// SetCMAFault makes c's reads and writes of peers' memory fail with err
// (nil: work).
func SetCMAFault(c *Comm, err error) { c.cma.fault = err }

// SetRanHook runs f after the work of every operation of this process, before
// its outcome is decided (nil: nothing).
func SetRanHook(f func(*Comm)) {
	if f == nil {
		testHookRan.Store(nil)
		return
	}
	testHookRan.Store(&f)
}

// SetEndpointHook makes Init wrap the endpoint it made with f (nil: as
// made).
func SetEndpointHook(f func(transport.Endpoint) transport.Endpoint) {
	if f == nil {
		testHookEndpoint.Store(nil)
		return
	}
	testHookEndpoint.Store(&f)
}

// DirectCounts reports how many chunks c sent straight from the caller's
// memory and how many it received straight into it (directexec.go).
func DirectCounts(c *Comm) (sent, landed uint64) { return c.exec.direct.sent, c.exec.direct.landed }

// DirectMin is the smallest chunk moved without slots.
const DirectMin = directMin

// DefaultSlotCount is the slots per connection when Config sets none.
const DefaultSlotCount = defaultSlotCount

// AsyncQueueLen is how many operations the async queue holds.
const AsyncQueueLen = asyncQueueLen

// AsyncProducerWaits reports whether the goroutine issuing async calls on
// c waits for room in a full queue.
func AsyncProducerWaits(c *Comm) bool { return c.async.full.Load() }

// CostlyPoll reports whether c's waits count each poll as a system call.
func CostlyPoll(c *Comm) bool { return c.exec.bo.CostlyPoll }
