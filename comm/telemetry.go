package comm

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/internal/clock"
	"github.com/gccl/gccl/internal/memops"
	"github.com/gccl/gccl/internal/records"
	"github.com/gccl/gccl/internal/seqlock"
)

// Telemetry: every operation a Comm runs leaves a record in a ring of the
// latest TelemetryRing records, and adds to cumulative totals per kind of
// operation. Both are read with Stats from any goroutine, and the records
// are written as JSON lines when Config.TelemetryFile (GCCL_TELEMETRY_FILE)
// is set (telemetry_file.go). Recording is on the path of every operation:
// it allocates nothing and takes no lock. One goroutine runs the Comm's
// operations at a time, so the ring has one writer; readers meet it through
// a sequence lock per slot, in atomic words.

// TelemetryRing is how many of a Comm's latest operations Stats reports.
const TelemetryRing = 1024

// LatencyBounds are the upper bounds of the latency histogram buckets of
// OpTotals.Latency: 1 µs to about 17 s by powers of four; the last bucket
// counts what took longer.
var LatencyBounds = records.LatencyBounds

// LatencyBuckets is the number of buckets of OpTotals.Latency.
const LatencyBuckets = records.LatencyBuckets

// OpRecord is one operation a Comm ran, as its telemetry ring keeps it.
type OpRecord struct {
	// N numbers the Comm's records from 1, one per operation run,
	// collectives and groups alike: a gap between two records read from
	// the ring or a file means lost records.
	N uint64
	// Seq is a collective's sequence number on the Comm, the same on every
	// rank (0 for Send, Recv and Group, which are not numbered): records
	// of one collective on different ranks have equal Seq.
	Seq uint64
	// Kind is "AllReduce", "Barrier", "AllToAllV", ..., or "Send", "Recv"
	// (a group of one) and "Group".
	Kind string
	// Bytes is this rank's payload: the larger of its input and output
	// buffers for a collective, the sum of its buffers for a group.
	Bytes int64
	// Type and Op are the element type, and the reduction of a reducing
	// collective (Op.Kind is 0 otherwise). Root is a rooted one's root.
	Type DataType
	Op   OpKind
	Root int
	// Path is how the call ran: "plan" (slot rings), "symmetric",
	// "device", "staged" (device buffers through host staging),
	// "variable" or "group"; Algorithm is the plan's ("Ring", "Tree",
	// "Direct", "Pairwise", "Hier"), empty when it ran none.
	Path      string
	Algorithm string
	// Transport is the Comm's transports, as Via names them ("INPROC",
	// "SHM", "TCP", "SHM+TCP" when peers are reached by several).
	Transport string
	// Start is when this rank reached the operation (for a collective, the
	// arrival time Stragglers compares between ranks), End when it left.
	Start, End time.Time
	// Failed: the operation returned an error (and aborted the Comm).
	Failed bool
	// LastRank is the rank that reached the collective last, -1 while
	// unknown: a rank learns it only by asking its peers, which Stragglers
	// does (it fills LastRank in for the collectives it reports). Across
	// files, the record with the latest Start among the ranks' records of
	// one Seq is the last arrival's.
	LastRank int
}

// Duration is how long the operation took on this rank.
func (r OpRecord) Duration() time.Duration { return r.End.Sub(r.Start) }

// OpTotals are a Comm's cumulative figures for one kind of operation.
type OpTotals struct {
	Kind   string
	Ops    uint64        // operations run
	Failed uint64        // of which failed
	Bytes  uint64        // their Bytes, summed
	Time   time.Duration // their durations, summed
	// Latency counts the operations by duration: Latency[i] those at most
	// LatencyBounds[i] (and more than the bound before), the last those
	// longer than every bound.
	Latency [LatencyBuckets]uint64
}

// Stats is a snapshot of a Comm's telemetry.
type Stats struct {
	Rank, Size int
	Transport  string
	// Ops is the number of operations run since Init (the last record's N).
	Ops uint64
	// Recent are the latest records, up to TelemetryRing, oldest first.
	Recent []OpRecord
	// Totals has one entry per kind of operation that ran, by kind.
	Totals []OpTotals
	// Dropped counts the records the telemetry file lost because its
	// writer fell a whole ring behind.
	Dropped uint64
}

// Record kinds: the tag kinds of tags.go (1..8 the collectives, tagBarrier,
// the variable-size collectives), with groups split by shape.
const (
	recGroup uint8 = tagP2P
	recSend  uint8 = 48
	recRecv  uint8 = 49
	recKinds       = 50
)

func recKindName(k uint8) string {
	switch k {
	case recGroup:
		return "Group"
	case recSend:
		return "Send"
	case recRecv:
		return "Recv"
	}
	return tagKindName(k)
}

var pathNames = [...]string{
	pathPlan: "plan", pathBarrier: "plan", pathSymmetric: "symmetric", pathDevice: "device",
	pathStaged: "staged", pathVariable: "variable", pathGroup: "group", pathDeterministic: "deterministic",
	pathCMA: "cma",
}

// telSlot is one record in the ring. rec's sequence is the record number
// too: 2n-1 while the writer writes record n, 2n once it is there. Its
// words are the telWord* below.
type telSlot struct {
	rec seqlock.Slot
	// last is LastRank+1 of record last>>lastShift (Stragglers writes it
	// after the record; tagged, so that no write resets it for the next).
	last atomic.Uint64
}

// The words of a telSlot's record.
const (
	telWordSeq  = iota
	telWordMeta // packMeta
	telWordBytes
	telWordStart // ns since 1970
	telWordEnd
)

const lastShift = 24 // ranks below 2^24-1

// telTotals are one kind's published totals; rawTotals the same in plain
// words. The operations are the sum of the latency buckets.
type telTotals struct {
	failed, bytes, nanos atomic.Uint64
	latency              [LatencyBuckets]atomic.Uint64
}

type rawTotals struct {
	failed, bytes, nanos uint64
	latency              [LatencyBuckets]uint64
}

func (r *rawTotals) add(meta uint64, bytes, start, end int64) {
	if meta>>40&1 != 0 {
		r.failed++
	}
	r.bytes += uint64(bytes)
	d := end - start
	if d > 0 {
		r.nanos += uint64(d)
	}
	r.latency[records.Bucket(time.Duration(d))]++
}

// telFoldEvery is how often the op goroutine publishes its totals.
const telFoldEvery = 64

// telemetry is a Comm's: the ring, the totals, the file writer.
type telemetry struct {
	ring [TelemetryRing]telSlot
	n    atomic.Uint64 // records made
	// Totals: the op goroutine adds each record to own (plain words, its
	// alone: no locked instruction per operation) and every telFoldEvery
	// records publishes the kinds that changed (dirty, a bit per kind) to
	// totals, under the sequence lock tver, with folded, the number of
	// records they cover. Stats adds the records after folded from the
	// ring.
	own       [recKinds]rawTotals
	dirty     uint64
	totals    [recKinds]telTotals
	tver      atomic.Uint64
	folded    atomic.Uint64
	transport string // the endpoint's name, computed once

	// The record being made, between telBegin and telEnd (op goroutine).
	cur struct {
		n, seq uint64
		meta   uint64
		bytes  int64
		start  int64 // wall clock
		line   int64 // clock.Read's line at start: the end is timed on it
	}

	file    string // Config.TelemetryFile or GCCL_TELEMETRY_FILE, unexpanded
	wmu     sync.Mutex
	w       atomic.Pointer[telWriter] // started by the first record when file is set
	stopped bool                      // Close stopped the writer: start no other (wmu)
	dropped atomic.Uint64
}

// meta layout: kind 8 bits, type 8, op 8, path 8, algorithm 8, failed 1,
// root 23 (ranks beyond 8M read as their value modulo 2^23).
func packMeta(kind uint8, dt DataType, op OpKind, p path, alg algo.Algorithm, failed bool, root int) uint64 {
	m := uint64(kind) | uint64(dt)<<8 | uint64(op)<<16 | uint64(p)<<24 | uint64(alg)<<32 | uint64(root&(1<<23-1))<<41
	if failed {
		m |= 1 << 40
	}
	return m
}

// telBegin starts the record of cl, on the goroutine running it, after its
// arrival is logged (runHeld).
func (c *Comm) telBegin(cl *call) {
	if cl.path == pathGroup {
		c.telBeginGroup(cl.group)
		return
	}
	var kind uint8
	var bytes int64
	op, root := OpKind(0), 0
	switch {
	case cl.barrier:
		kind, bytes = tagBarrier, 1
	case cl.vkind != 0:
		kind, bytes = cl.vkind, int64(max(len(cl.in.b), len(cl.out.b)))
	default:
		kind, bytes = uint8(cl.coll), int64(max(len(cl.in.b), len(cl.out.b)))
		if cl.coll.Reducing() {
			op = cl.op.Kind
		}
		if cl.coll.Rooted() {
			root = cl.root
		}
	}
	// arrive's clock reading: the arrival time Stragglers compares.
	a := &c.arrivals[cl.seq%arrivalLog]
	c.telStartRecord(cl.seq, packMeta(kind, cl.dtype(), op, cl.path, 0, false, root), bytes, a.at, a.line)
}

// telBeginGroup starts the record of a group of sends and receives (a
// blocking host group runs outside runHeld: Group).
func (c *Comm) telBeginGroup(ops []P2P) {
	kind := recGroup
	var bytes int64
	var dt DataType
	for i := range ops {
		bytes += int64(len(ops[i].v.b))
	}
	if len(ops) > 0 {
		dt = ops[0].v.dt
	}
	if len(ops) == 1 {
		kind = recSend
		if ops[0].recv {
			kind = recRecv
		}
	}
	line, off := clock.Read()
	c.telStartRecord(0, packMeta(kind, dt, 0, pathGroup, 0, false, 0), bytes, line+off, line)
}

// telStartRecord begins a record at wall-clock time start, which was line
// on clock.Read's line.
func (c *Comm) telStartRecord(seq, meta uint64, bytes, start, line int64) {
	cur := &c.tel.cur
	cur.n = c.tel.n.Load() + 1
	cur.seq, cur.meta, cur.bytes, cur.start, cur.line = seq, meta, bytes, start, line
	// The plan path sets args.plan: clear the last call's, so that a call
	// that runs no plan reports none.
	c.args.plan = nil
}

// telEnd finishes the record begun by telBegin and publishes it.
func (c *Comm) telEnd(failed bool) {
	t := &c.tel
	cur := &t.cur
	// Timed on the line: a step of the wall clock during the operation
	// moves its record, not its duration.
	end := cur.start + (clock.Line() - cur.line)
	meta := cur.meta
	if p := c.args.plan; p != nil {
		meta |= uint64(p.Algo) << 32
	}
	if failed {
		meta |= 1 << 40
	}
	w := [seqlock.Words]uint64{cur.seq, meta, uint64(cur.bytes), uint64(cur.start), uint64(end)}
	t.ring[(cur.n-1)%TelemetryRing].rec.Write(2*cur.n, &w, &t.n, cur.n)

	t.own[uint8(meta)].add(meta, cur.bytes, cur.start, end)
	t.dirty |= 1 << uint8(meta)
	if cur.n%telFoldEvery == 0 {
		t.fold(cur.n)
	}

	if t.file != "" {
		c.telNotify(cur.n)
	}
}

// fold publishes the totals of records 1..n (op goroutine).
func (t *telemetry) fold(n uint64) {
	v := t.tver.Load()
	t.tver.Store(v + 1)
	for k := range t.own {
		if t.dirty&(1<<k) == 0 {
			continue
		}
		o, p := &t.own[k], &t.totals[k]
		p.failed.Store(o.failed)
		p.bytes.Store(o.bytes)
		p.nanos.Store(o.nanos)
		for i := range o.latency {
			p.latency[i].Store(o.latency[i])
		}
	}
	t.folded.Store(n)
	t.tver.Store(v + 2)
	t.dirty = 0
}

// snapshotTotals reads the published totals and adds the records after
// them from the ring.
func (t *telemetry) snapshotTotals(out *[recKinds]rawTotals) {
	for {
		v := t.tver.Load()
		if v&1 != 0 {
			runtime.Gosched()
			continue
		}
		for k := range t.totals {
			p, o := &t.totals[k], &out[k]
			o.failed, o.bytes, o.nanos = p.failed.Load(), p.bytes.Load(), p.nanos.Load()
			for i := range o.latency {
				o.latency[i] = p.latency[i].Load()
			}
		}
		folded := t.folded.Load()
		if t.tver.Load() != v {
			continue
		}
		n, ok := t.n.Load(), true
		for i := folded + 1; i <= n && ok; i++ {
			var meta uint64
			var bytes, start, end int64
			if _, meta, bytes, start, end, _, ok = t.readRaw(i); ok {
				out[uint8(meta)].add(meta, bytes, start, end)
			}
		}
		if ok {
			return
		}
		// The writer lapped the ring meanwhile, and folded since: again.
	}
}

// telSetLast records that rank arrived last at collective seq, if its record
// is still in the ring (Stragglers, on the op goroutine).
func (c *Comm) telSetLast(seq uint64, rank int) {
	t := &c.tel
	n := t.n.Load()
	for i := uint64(0); i < min(n, TelemetryRing); i++ {
		s := &t.ring[(n-1-i)%TelemetryRing]
		var w [seqlock.Words]uint64
		v, ok := s.rec.Read(&w) // this goroutine writes the ring: ok
		if !ok || w[telWordSeq] != seq || uint8(w[telWordMeta]) == recGroup {
			continue
		}
		if rank+1 < 1<<lastShift {
			s.last.Store(v/2<<lastShift | uint64(rank+1))
		}
		return
	}
}

// readRaw reads record n's words out of its slot; ok is false once the
// writer has overwritten it (or, for n past the last, not written it yet).
func (t *telemetry) readRaw(n uint64) (seq, meta uint64, bytes, start, end int64, last int, ok bool) {
	s := &t.ring[(n-1)%TelemetryRing]
	var w [seqlock.Words]uint64
	for {
		v, ok := s.rec.Read(&w)
		switch {
		case v < 2*n-1, v > 2*n:
			return 0, 0, 0, 0, 0, 0, false // not written yet, or overwritten
		case !ok:
			runtime.Gosched() // being written: a few stores away
			continue
		}
		if tagged := s.last.Load(); tagged>>lastShift == n {
			last = int(tagged & (1<<lastShift - 1))
		}
		return w[telWordSeq], w[telWordMeta], int64(w[telWordBytes]), int64(w[telWordStart]), int64(w[telWordEnd]), last - 1, true
	}
}

// read copies record n out of its slot; ok is false once the writer has
// overwritten it.
func (t *telemetry) read(n uint64, r *OpRecord) bool {
	seq, meta, bytes, start, end, last, ok := t.readRaw(n)
	if !ok {
		return false
	}
	*r = OpRecord{
		N: n, Seq: seq, Kind: recKindName(uint8(meta)), Bytes: bytes,
		Type: DataType(meta >> 8 & 0xff), Op: OpKind(meta >> 16 & 0xff), Root: int(meta >> 41),
		Path: pathNames[meta>>24&0xff], Transport: t.transport,
		Start: time.Unix(0, start), End: time.Unix(0, end),
		Failed: meta>>40&1 != 0, LastRank: last,
	}
	if alg := algo.Algorithm(meta >> 32 & 0xff); alg != 0 {
		r.Algorithm = alg.String()
	}
	return true
}

// Stats returns a snapshot of the Comm's telemetry: its latest operations
// and its totals since Init. It is safe to call from any goroutine, also
// while operations run (it then sees those finished so far) and after
// Close.
func (c *Comm) Stats() Stats {
	t := &c.tel
	st := Stats{Rank: c.rank, Size: c.size, Transport: t.transport, Dropped: t.dropped.Load()}
	n := t.n.Load()
	st.Ops = n
	first := uint64(1)
	if n > TelemetryRing {
		first = n - TelemetryRing + 1
	}
	// Newest first, up to the first record the writer overwrote meanwhile
	// (those before it are about to go too): no gaps.
	st.Recent = make([]OpRecord, n-first+1)
	i := len(st.Recent)
	for ; i > 0 && t.read(first+uint64(i)-1, &st.Recent[i-1]); i-- {
	}
	st.Recent = st.Recent[i:]
	var tot [recKinds]rawTotals
	t.snapshotTotals(&tot)
	for k := range tot {
		o := &tot[k]
		ot := OpTotals{Kind: recKindName(uint8(k)), Failed: o.failed, Bytes: o.bytes,
			Time: time.Duration(o.nanos), Latency: o.latency}
		for _, b := range o.latency {
			ot.Ops += b
		}
		if ot.Ops > 0 {
			st.Totals = append(st.Totals, ot)
		}
	}
	return st
}

func (c *Comm) initTelemetry(cfg *Config) {
	// Ready the ring's 14 pages now: else the first thousand operations
	// take their first touches, a stall of 6-15 µs every 73 operations on
	// a KVM guest ("First touches" in docs/PERFORMANCE.md).
	ring := unsafe.Slice((*byte)(unsafe.Pointer(&c.tel.ring)), unsafe.Sizeof(c.tel.ring))
	_ = memops.Prefault(ring, true)
	c.tel.transport = c.ep.Name()
	c.tel.file = cfg.TelemetryFile
	if c.tel.file == "" {
		c.tel.file = os.Getenv("GCCL_TELEMETRY_FILE")
	}
}
