// Package algo holds collective algorithms as pure schedules.
//
// A Plan is the list of steps one rank executes for one collective on n ranks.
// Plans know nothing about sizes, memory or transports: a step names logical
// blocks of the collective's buffers, and the executor (package comm) maps a
// block and a pipeline chunk to bytes, moves them over connections and reduces
// them with internal/reduce. Because plans are pure data they can be printed,
// compared against golden files and cached per shape.
//
// # Blocks
//
// Every collective views its data as NBlocks logical blocks. A buffer holds
// either all of them (block b at b*blockLen) or exactly one of them, its own
// (at offset 0):
//
//	collective      NBlocks            In holds          Out holds
//	AllReduce       n (ring) 2 (tree)  all               all
//	ReduceScatter   n                  all               block rank
//	AllGather       n                  block rank        all
//	Broadcast       1 (chain) 2 (tree) all (root only)   all
//	Reduce          1 (chain) 2 (tree) all               all (root only)
//	AllToAll        n                  all               all
//	Gather          n                  block rank        all (root only)
//	Scatter         n                  all (root only)   block rank
//
// For AllReduce, Broadcast and Reduce the blocks partition the vector of
// count elements as evenly as possible (block b starts at count*b/NBlocks);
// for the others each block is count elements long.
//
// A third buffer, Tmp, is scratch the executor provides: it holds all blocks
// but only for the current chunk, so it is valid only within one run of a
// phase on one chunk index (an interior tree node at a non-root rank of Reduce
// accumulates its children there, since Out exists only at the root).
//
// # Chunks and phases
//
// The executor splits every block into chunks that fit one transport slot and
// runs each phase once per chunk index c: every step of the phase, in order,
// on chunk c of the blocks it names. Phase p+1 starts only after phase p has
// run for all chunks. A ring all-reduce is one phase of 2n-1 steps (2(n-1)
// sends and 2(n-1) receives), so the pipeline is chunk-major; a tree
// all-reduce is two phases (up, then down), as in NCCL, so the reduction of
// chunk c+1 overlaps the broadcast of chunk c on other ranks.
//
// Chunks that are empty (a short block) are skipped by sender and receiver
// alike, since both compute the same lengths.
//
// A fused step holds its incoming slot while it waits for an outgoing one, so
// ring plans need at least two slots per connection (ring.MinSlots): with one,
// every rank of the ring waits on its successor. Transports provide at least
// two.
//
// # Reductions
//
// In reducing collectives (AllReduce, ReduceScatter, Reduce) a step that reads
// its local operand from In applies the op's pre-scaling (PreMulSum, float
// Avg) to it: each rank's In is read exactly once by a correct schedule. A
// step with Final set produces the complete reduction of its block; the
// executor applies the op's post-operation (integer Avg division) there,
// before the value is stored or sent on, so that a final recvReduceCopySend
// forwards the finished value. Copy pre-scales only in reducing collectives.
package algo

import (
	"fmt"
	"strings"
)

// Collective names a collective operation.
type Collective uint8

const (
	AllReduce Collective = iota + 1
	ReduceScatter
	AllGather
	Broadcast
	Reduce
	AllToAll
	Gather
	Scatter
)

var collectiveNames = [...]string{
	AllReduce:     "AllReduce",
	ReduceScatter: "ReduceScatter",
	AllGather:     "AllGather",
	Broadcast:     "Broadcast",
	Reduce:        "Reduce",
	AllToAll:      "AllToAll",
	Gather:        "Gather",
	Scatter:       "Scatter",
}

func (c Collective) String() string {
	if int(c) < len(collectiveNames) && collectiveNames[c] != "" {
		return collectiveNames[c]
	}
	return fmt.Sprintf("Collective(%d)", uint8(c))
}

// Reducing reports whether the collective combines data with a reduction op.
func (c Collective) Reducing() bool {
	return c == AllReduce || c == ReduceScatter || c == Reduce
}

// Rooted reports whether the collective has a root rank.
func (c Collective) Rooted() bool {
	return c == Broadcast || c == Reduce || c == Gather || c == Scatter
}

// Algorithm names a family of schedules.
type Algorithm uint8

const (
	Ring     Algorithm = iota + 1 // ring, or a pipelined chain for rooted collectives
	Tree                          // double binary tree
	Pairwise                      // pairwise exchange (all-to-all)
	Direct                        // ranks talk to each other directly (gather, scatter, two-rank all-reduce)
	Hier                          // hierarchical: within each host, then across hosts, then within (algo/hier)
	Doubling                      // recursive doubling: log2(n) pairwise swaps (small all-reduce)
)

func (a Algorithm) String() string {
	switch a {
	case Ring:
		return "Ring"
	case Tree:
		return "Tree"
	case Pairwise:
		return "Pairwise"
	case Direct:
		return "Direct"
	case Hier:
		return "Hier"
	case Doubling:
		return "Doubling"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Buf names one of a collective's two user buffers.
type Buf uint8

const (
	In  Buf = iota + 1 // the send buffer
	Out                // the receive buffer
	Tmp                // per-chunk scratch provided by the executor
)

func (b Buf) String() string {
	switch b {
	case In:
		return "in"
	case Out:
		return "out"
	case Tmp:
		return "tmp"
	}
	return "?"
}

// Ref names a logical block of a buffer. The zero Ref means "none".
type Ref struct {
	Buf   Buf
	Block int
}

// Valid reports whether r names a block.
func (r Ref) Valid() bool { return r.Buf != 0 }

func (r Ref) String() string {
	if !r.Valid() {
		return "-"
	}
	return fmt.Sprintf("%s[%d]", r.Buf, r.Block)
}

// Prim is a fused primitive: what one step does with at most one incoming
// message, one local operand and one outgoing message. Every byte is read once
// from the incoming slot and written once to the outgoing slot or buffer.
//
// The reducing primitives compute msg op Src (Src op msg with
// Step.SrcFirst), pre-scaling Src when it is In and the op pre-scales.
// LocalReduce and SrcFirst steps never pre-scale: their Src is Out or Tmp,
// or In of an Unscaled plan (which the executor never runs with a
// pre-scaling op).
type Prim uint8

const (
	// Send copies Src into an outgoing slot to SendPeer.
	Send Prim = iota + 1
	// Recv copies a message from RecvPeer into Dst.
	Recv
	// CopySend copies Src into Dst and into an outgoing slot to SendPeer
	// (the copy to Dst is skipped when Src and Dst are the same memory).
	CopySend
	// RecvCopySend copies a message from RecvPeer into Dst and into an
	// outgoing slot to SendPeer.
	RecvCopySend
	// RecvReduceSend reduces a message from RecvPeer with Src straight into
	// an outgoing slot to SendPeer.
	RecvReduceSend
	// RecvReduceCopy reduces a message from RecvPeer with Src into Dst.
	RecvReduceCopy
	// RecvReduceCopySend reduces a message from RecvPeer with Src into Dst
	// and into an outgoing slot to SendPeer.
	RecvReduceCopySend
	// Copy copies Src into Dst locally, applying pre- and post-operations as
	// a one-rank reduction would (used for n = 1 and for a rank's own block
	// in all-to-all). Skipped when Src and Dst are the same memory and there
	// is nothing to apply.
	Copy
	// SendRecv sends Src to SendPeer and receives from RecvPeer into Dst,
	// progressing both at once so that exchanges in any pattern cannot
	// deadlock.
	SendRecv
	// LocalReduce reduces Src into Dst locally: Dst = Src op Dst. With
	// Step.SrcFirst it lets plans in which every rank reduces every
	// contribution itself give all ranks the same operands in the same
	// order, so that they agree to the bit (NaN operands of min and max
	// included).
	LocalReduce
)

var primNames = [...]string{
	Send:               "send",
	Recv:               "recv",
	CopySend:           "copySend",
	RecvCopySend:       "recvCopySend",
	RecvReduceSend:     "recvReduceSend",
	RecvReduceCopy:     "recvReduceCopy",
	RecvReduceCopySend: "recvReduceCopySend",
	Copy:               "copy",
	SendRecv:           "sendRecv",
	LocalReduce:        "localReduce",
}

func (p Prim) String() string {
	if int(p) < len(primNames) && primNames[p] != "" {
		return primNames[p]
	}
	return fmt.Sprintf("Prim(%d)", uint8(p))
}

// Sends reports whether the primitive writes an outgoing message.
func (p Prim) Sends() bool {
	switch p {
	case Send, CopySend, RecvCopySend, RecvReduceSend, RecvReduceCopySend, SendRecv:
		return true
	}
	return false
}

// Recvs reports whether the primitive consumes an incoming message.
func (p Prim) Recvs() bool {
	switch p {
	case Recv, RecvCopySend, RecvReduceSend, RecvReduceCopy, RecvReduceCopySend, SendRecv:
		return true
	}
	return false
}

// Reduces reports whether the primitive combines two operands: an incoming
// message with Src, or (LocalReduce) Src with Dst.
func (p Prim) Reduces() bool {
	return p == RecvReduceSend || p == RecvReduceCopy || p == RecvReduceCopySend || p == LocalReduce
}

// Step is one fused primitive on one chunk. Fields a primitive does not use
// are zero (peers -1). The fields each primitive uses:
//
//	Send                SendPeer, Src
//	Recv                RecvPeer, Dst
//	CopySend            SendPeer, Src, Dst
//	RecvCopySend        RecvPeer, SendPeer, Dst
//	RecvReduceSend      RecvPeer, SendPeer, Src
//	RecvReduceCopy      RecvPeer, Src, Dst
//	RecvReduceCopySend  RecvPeer, SendPeer, Src, Dst
//	Copy                Src, Dst
//	SendRecv            SendPeer, Src, RecvPeer, Dst
//	LocalReduce         Src, Dst
type Step struct {
	Prim     Prim
	SendPeer int // rank the outgoing message goes to, or -1
	RecvPeer int // rank the incoming message comes from, or -1
	Src      Ref // local operand (read)
	Dst      Ref // local destination (written)
	Final    bool
	// SrcFirst puts Src before the incoming message in a reduction (Src
	// op msg instead of msg op Src), so that ranks that reduce the same
	// operands apart agree to the bit. Only for primitives that receive
	// and reduce.
	SrcFirst bool
}

func (s Step) String() string {
	var b strings.Builder
	b.WriteString(s.Prim.String())
	if s.Prim.Recvs() {
		fmt.Fprintf(&b, " from=%d", s.RecvPeer)
	}
	if s.Prim.Sends() {
		fmt.Fprintf(&b, " to=%d", s.SendPeer)
	}
	if s.Src.Valid() {
		fmt.Fprintf(&b, " src=%s", s.Src)
	}
	if s.Dst.Valid() {
		fmt.Fprintf(&b, " dst=%s", s.Dst)
	}
	if s.SrcFirst {
		b.WriteString(" srcFirst")
	}
	if s.Final {
		b.WriteString(" final")
	}
	return b.String()
}

// Plan is the schedule of one rank for one collective.
type Plan struct {
	Coll    Collective
	Algo    Algorithm
	NRanks  int
	Rank    int
	Root    int // rooted collectives only; 0 otherwise
	NBlocks int
	Phases  [][]Step
	// Unscaled marks a plan that reads a rank's In more than once (to send
	// it and to reduce it locally, say). Its reductions are only correct
	// for ops without pre-scaling: each read would scale In again, and an
	// in-place scaling would change it under the next read. The executor
	// refuses to run it with PreMulSum or floating-point Avg.
	Unscaled bool
}

// String prints the plan in the stable form used by golden files.
func (p *Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s n=%d rank=%d root=%d blocks=%d", p.Coll, p.Algo, p.NRanks, p.Rank, p.Root, p.NBlocks)
	if p.Unscaled {
		b.WriteString(" unscaled")
	}
	b.WriteString("\n")
	for i, ph := range p.Phases {
		fmt.Fprintf(&b, "  phase %d\n", i)
		for _, s := range ph {
			fmt.Fprintf(&b, "    %s\n", s)
		}
	}
	return b.String()
}

// Validate checks the invariants the executor relies on.
func (p *Plan) Validate() error {
	if p.NRanks < 1 || p.Rank < 0 || p.Rank >= p.NRanks {
		return fmt.Errorf("algo: plan has rank %d of %d", p.Rank, p.NRanks)
	}
	if p.NBlocks < 1 {
		return fmt.Errorf("algo: plan has %d blocks", p.NBlocks)
	}
	checkRef := func(r Ref) error {
		if r.Valid() && (r.Block < 0 || r.Block >= p.NBlocks) {
			return fmt.Errorf("algo: block %s out of range [0,%d)", r, p.NBlocks)
		}
		return nil
	}
	for _, ph := range p.Phases {
		for _, s := range ph {
			if s.Prim.Sends() && (s.SendPeer < 0 || s.SendPeer >= p.NRanks || s.SendPeer == p.Rank) {
				return fmt.Errorf("algo: step %q: bad send peer", s)
			}
			if s.Prim.Recvs() && (s.RecvPeer < 0 || s.RecvPeer >= p.NRanks || s.RecvPeer == p.Rank) {
				return fmt.Errorf("algo: step %q: bad recv peer", s)
			}
			if s.SrcFirst && !(s.Prim.Recvs() && s.Prim.Reduces()) {
				return fmt.Errorf("algo: step %q: srcFirst on a step that does not reduce a message", s)
			}
			if err := checkRef(s.Src); err != nil {
				return err
			}
			if err := checkRef(s.Dst); err != nil {
				return err
			}
		}
	}
	return nil
}
