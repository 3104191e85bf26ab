package comm_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gccl/gccl/comm"
)

// telOp is one operation of the telemetry tests, and what its record must
// say on rank r of n.
type telOp struct {
	kind  string
	bytes func(r, n int) int64
	op    string // "" when none
	root  int
	run   func(c *comm.Comm) error
}

func telOps(n int) []telOp {
	const count = 1000
	f32 := func(k int) func(int, int) int64 { return func(int, int) int64 { return int64(4 * k) } }
	return []telOp{
		{kind: "AllReduce", bytes: f32(count), op: "sum", run: func(c *comm.Comm) error {
			x := make([]float32, count)
			return comm.AllReduce(bg, c, x, x, comm.Sum)
		}},
		{kind: "Broadcast", bytes: f32(77), root: 1, run: func(c *comm.Comm) error {
			x := make([]float32, 77)
			return comm.Broadcast(bg, c, x, x, 1)
		}},
		{kind: "AllGather", bytes: f32(10 * n), run: func(c *comm.Comm) error {
			return comm.AllGather(bg, c, make([]float32, 10), make([]float32, 10*n))
		}},
		{kind: "Barrier", bytes: func(int, int) int64 { return 1 }, run: func(c *comm.Comm) error {
			return c.Barrier(bg)
		}},
		{kind: "Reduce", bytes: func(int, int) int64 { return 8 * 5 }, op: "max", root: 2, run: func(c *comm.Comm) error {
			return comm.Reduce(bg, c, make([]int64, 5), make([]int64, 5), comm.Max, 2)
		}},
		{kind: "Group", bytes: func(int, int) int64 { return 2 * 8 * 3 }, run: func(c *comm.Comm) error {
			r := c.Rank()
			return c.Group(bg, comm.SendTo((r+1)%n, make([]float64, 3)), comm.RecvFrom((r+n-1)%n, make([]float64, 3)))
		}},
		{kind: "AllReduce", bytes: f32(count), op: "avg", run: func(c *comm.Comm) error {
			x := make([]float32, count)
			return comm.AllReduceAsync(c, x, x, comm.Avg).Wait(bg)
		}},
		{kind: "AllToAllV", bytes: func(r, n int) int64 { return int64(4 * max(n*(r+1), n*(n+1)/2)) }, run: func(c *comm.Comm) error {
			sc, rc := make([]int, n), make([]int, n)
			for p := range n {
				sc[p], rc[p] = c.Rank()+1, p+1
			}
			send := make([]float32, n*(c.Rank()+1))
			recv := make([]float32, n*(n+1)/2)
			return comm.AllToAllV(bg, c, send, sc, recv, rc)
		}},
	}
}

// telemetryLine is a line of the telemetry file, as a reader decodes it.
type telemetryLine struct {
	Rank, Size int
	N, Seq     uint64
	Kind       string
	Bytes      int64
	Type       string
	Op         string
	Root       int
	Path       string
	Algo       string
	Transport  string
	StartNs    int64 `json:"start_ns"`
	EndNs      int64 `json:"end_ns"`
	TimeUs     float64
	Failed     bool
}

func readTelemetry(t *testing.T, name string) []telemetryLine {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []telemetryLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l telemetryLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s: %q: %v", name, sc.Text(), err)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTelemetryFileOneRecordPerOp runs a 4-rank job with a telemetry file
// per rank and checks that each holds exactly one line per operation run,
// in order, saying what ran, and that Stats reports the same.
func TestTelemetryFileOneRecordPerOp(t *testing.T) {
	const n = 4
	dir := t.TempDir()
	pattern := filepath.Join(dir, "tel-%r.jsonl")
	cs, err := comm.InitLocal(n, &comm.Config{TelemetryFile: pattern})
	if err != nil {
		t.Fatal(err)
	}
	ops := telOps(n)
	for _, op := range ops {
		mustAll(t, onAll(t, cs, op.run))
	}
	// Stats while the Comms are open: the same records.
	for _, c := range cs {
		st := c.Stats()
		if st.Ops != uint64(len(ops)) || len(st.Recent) != len(ops) {
			t.Fatalf("rank %d: Stats has %d ops, %d records; ran %d", c.Rank(), st.Ops, len(st.Recent), len(ops))
		}
		for i, rec := range st.Recent {
			if rec.N != uint64(i+1) || rec.Kind != ops[i].kind || rec.Bytes != ops[i].bytes(c.Rank(), n) ||
				rec.Transport != "INPROC" || rec.Failed || rec.LastRank != -1 || rec.End.Before(rec.Start) {
				t.Errorf("rank %d record %d: %+v, ran %s of %d bytes", c.Rank(), i, rec, ops[i].kind, ops[i].bytes(c.Rank(), n))
			}
		}
		ar := st.Recent[0]
		if ar.Type != comm.Float32 || ar.Op != comm.OpSum || ar.Path != "plan" || ar.Algorithm == "" || ar.Seq == 0 {
			t.Errorf("rank %d: the all-reduce's record: %+v", c.Rank(), ar)
		}
		var total uint64
		for _, tot := range st.Totals {
			total += tot.Ops
			var inBuckets uint64
			for _, b := range tot.Latency {
				inBuckets += b
			}
			if inBuckets != tot.Ops {
				t.Errorf("rank %d %s: %d ops, %d in the latency buckets", c.Rank(), tot.Kind, tot.Ops, inBuckets)
			}
			if tot.Kind == "AllReduce" && (tot.Ops != 2 || tot.Bytes != 8000) {
				t.Errorf("rank %d: all-reduce totals %+v", c.Rank(), tot)
			}
		}
		if total != uint64(len(ops)) {
			t.Errorf("rank %d: totals count %d ops, ran %d", c.Rank(), total, len(ops))
		}
	}
	for _, c := range cs {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	seqs := make([][]uint64, n)
	for r := range n {
		lines := readTelemetry(t, filepath.Join(dir, fmt.Sprintf("tel-%d.jsonl", r)))
		if len(lines) != len(ops) {
			t.Fatalf("rank %d wrote %d records, ran %d operations", r, len(lines), len(ops))
		}
		for i, l := range lines {
			want := ops[i]
			if l.Rank != r || l.Size != n || l.N != uint64(i+1) || l.Kind != want.kind || l.Bytes != want.bytes(r, n) ||
				l.Op != want.op || l.Root != want.root || l.Transport != "INPROC" || l.Failed ||
				l.EndNs < l.StartNs || l.StartNs == 0 {
				t.Errorf("rank %d line %d: %+v; ran %+v", r, i, l, want)
			}
			seqs[r] = append(seqs[r], l.Seq)
		}
	}
	// A collective's records carry the same sequence number on every rank.
	for r := 1; r < n; r++ {
		for i := range seqs[r] {
			if seqs[r][i] != seqs[0][i] {
				t.Errorf("op %d: rank %d seq %d, rank 0 seq %d", i, r, seqs[r][i], seqs[0][i])
			}
		}
	}
}

// TestTelemetryEnvPattern: GCCL_TELEMETRY_FILE is the default, with %p.
func TestTelemetryEnvPattern(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("GCCL_TELEMETRY_FILE", filepath.Join(dir, "t-%p-%r.jsonl"))
	cs := world(t, 2, nil)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error { return c.Barrier(bg) }))
	for _, c := range cs {
		c.Close()
	}
	for r := range 2 {
		lines := readTelemetry(t, filepath.Join(dir, fmt.Sprintf("t-%d-%d.jsonl", os.Getpid(), r)))
		if len(lines) != 1 || lines[0].Kind != "Barrier" {
			t.Errorf("rank %d: %+v", r, lines)
		}
	}
}

// TestTelemetryStragglersFillLastRank: Stragglers tells each rank which
// rank arrived last, and the records keep it.
func TestTelemetryStragglersFillLastRank(t *testing.T) {
	const n = 3
	cs := world(t, n, nil)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error { return c.Barrier(bg) }))
	reports := make([][]comm.Straggle, n)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) (err error) {
		reports[c.Rank()], err = c.Stragglers(bg)
		return err
	}))
	for _, c := range cs {
		rec := c.Stats().Recent[0]
		if len(reports[c.Rank()]) == 0 || rec.Seq != reports[c.Rank()][0].Seq || rec.LastRank != reports[c.Rank()][0].Last {
			t.Errorf("rank %d: record %+v, report %+v", c.Rank(), rec, reports[c.Rank()])
		}
	}
}

// TestTelemetryRingWraps: past TelemetryRing operations Stats keeps the
// latest, numbered on.
func TestTelemetryRingWraps(t *testing.T) {
	cs := world(t, 1, nil)
	c := cs[0]
	x := make([]int32, 3)
	const ops = comm.TelemetryRing + 10
	for range ops {
		if err := comm.AllReduce(bg, c, x, x, comm.Sum); err != nil {
			t.Fatal(err)
		}
	}
	st := c.Stats()
	if st.Ops != ops || len(st.Recent) != comm.TelemetryRing || st.Recent[0].N != 11 || st.Recent[len(st.Recent)-1].N != ops {
		t.Fatalf("Ops %d, %d records from %d", st.Ops, len(st.Recent), st.Recent[0].N)
	}
	// Totals cover every operation, those gone from the ring included.
	if len(st.Totals) != 1 || st.Totals[0].Ops != ops || st.Totals[0].Bytes != ops*12 || st.Totals[0].Failed != 0 {
		t.Fatalf("totals %+v after %d all-reduces of 12 bytes", st.Totals, ops)
	}
}

// TestTelemetryStatsWhileRunning reads Stats on another goroutine while
// operations run (for the race detector) and checks every snapshot is
// consistent: records numbered without gaps.
func TestTelemetryStatsWhileRunning(t *testing.T) {
	cs := world(t, 2, nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st := cs[0].Stats()
			// Totals are read after the records: they cover at least
			// as many operations, exactly.
			if len(st.Totals) > 0 && (st.Totals[0].Ops < st.Ops || st.Totals[0].Bytes != st.Totals[0].Ops*128) {
				t.Errorf("%d ops recorded, totals %+v", st.Ops, st.Totals)
				return
			}
			for i := 1; i < len(st.Recent); i++ {
				if st.Recent[i].N != st.Recent[i-1].N+1 || st.Recent[i].Kind != "AllReduce" {
					t.Errorf("records %+v then %+v", st.Recent[i-1], st.Recent[i])
					return
				}
			}
		}
	}()
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		x := make([]float64, 16)
		for range 3000 {
			if err := comm.AllReduce(bg, c, x, x, comm.Sum); err != nil {
				return err
			}
		}
		return nil
	}))
	close(stop)
	wg.Wait()
}

// TestTelemetryAllocatesNothing: with the telemetry file on, a steady-state
// blocking all-reduce still allocates nothing (the file writer runs on its
// own goroutine, whose allocations AllocsPerRun counts too: it must drain
// without allocating in steady state as well, or it would show).
func TestTelemetryAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const n = 4
	cs := world(t, n, &comm.Config{TelemetryFile: filepath.Join(t.TempDir(), "a-%r.jsonl")})
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, 20000)
	}
	run, stop := lockstep(t, cs, func(c *comm.Comm) error {
		return comm.AllReduce(bg, c, bufs[c.Rank()], bufs[c.Rank()], comm.Sum)
	})
	defer stop()
	run() // warm up, and start the writers
	if a := testing.AllocsPerRun(50, run); a != 0 {
		t.Fatalf("%v allocations per all-reduce with telemetry on", a)
	}
	for _, c := range cs {
		if st := c.Stats(); st.Ops != 52 {
			t.Fatalf("rank %d: %d ops recorded, ran 52", c.Rank(), st.Ops)
		}
	}
}
