package metrics

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/p2p"
)

var bg = context.Background()

// onAll runs f on every rank at once.
func onAll(t *testing.T, cs []*comm.Comm, f func(c *comm.Comm) error) {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(c) }()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func twoRanks(t *testing.T) []*comm.Comm {
	t.Helper()
	cs, err := comm.InitLocal(2, &comm.Config{SlotSize: 4096, SlotCount: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	return cs
}

// TestCommCounters: the counters say what ran, per rank and collective,
// and move with every operation; the histogram counts every operation.
func TestCommCounters(t *testing.T) {
	cs := twoRanks(t)
	col := New()
	for _, c := range cs {
		col.AddComm("world", c)
	}
	if n := testutil.CollectAndCount(col, "gccl_coll_ops_total"); n != 0 {
		t.Fatalf("%d op series before any operation", n)
	}
	allReduce := func(c *comm.Comm) error {
		x := make([]float32, 1000)
		return comm.AllReduce(bg, c, x, x, comm.Sum)
	}
	for range 3 {
		onAll(t, cs, allReduce)
	}
	onAll(t, cs, func(c *comm.Comm) error { return c.Barrier(bg) })
	const want = `
# HELP gccl_coll_bytes_total Payload bytes of the operations (the larger of a rank's input and output).
# TYPE gccl_coll_bytes_total counter
gccl_coll_bytes_total{collective="AllReduce",comm="world",rank="0",transport="INPROC"} 12000
gccl_coll_bytes_total{collective="AllReduce",comm="world",rank="1",transport="INPROC"} 12000
gccl_coll_bytes_total{collective="Barrier",comm="world",rank="0",transport="INPROC"} 1
gccl_coll_bytes_total{collective="Barrier",comm="world",rank="1",transport="INPROC"} 1
# HELP gccl_coll_ops_total Operations a communicator ran.
# TYPE gccl_coll_ops_total counter
gccl_coll_ops_total{collective="AllReduce",comm="world",rank="0",transport="INPROC"} 3
gccl_coll_ops_total{collective="AllReduce",comm="world",rank="1",transport="INPROC"} 3
gccl_coll_ops_total{collective="Barrier",comm="world",rank="0",transport="INPROC"} 1
gccl_coll_ops_total{collective="Barrier",comm="world",rank="1",transport="INPROC"} 1
# HELP gccl_comm_aborted 1 once the communicator aborted.
# TYPE gccl_comm_aborted gauge
gccl_comm_aborted{comm="world",rank="0"} 0
gccl_comm_aborted{comm="world",rank="1"} 0
# HELP gccl_comm_memory_bytes Memory the communicator holds, by kind.
# TYPE gccl_comm_memory_bytes gauge
gccl_comm_memory_bytes{comm="world",kind="ring_heap",rank="0"} 16448
gccl_comm_memory_bytes{comm="world",kind="ring_heap",rank="1"} 16448
gccl_comm_memory_bytes{comm="world",kind="ring_registered",rank="0"} 0
gccl_comm_memory_bytes{comm="world",kind="ring_registered",rank="1"} 0
gccl_comm_memory_bytes{comm="world",kind="ring_shared",rank="0"} 0
gccl_comm_memory_bytes{comm="world",kind="ring_shared",rank="1"} 0
gccl_comm_memory_bytes{comm="world",kind="staging",rank="0"} 8192
gccl_comm_memory_bytes{comm="world",kind="staging",rank="1"} 8192
gccl_comm_memory_bytes{comm="world",kind="symmetric",rank="0"} 0
gccl_comm_memory_bytes{comm="world",kind="symmetric",rank="1"} 0
gccl_comm_memory_bytes{comm="world",kind="symmetric_mapped",rank="0"} 0
gccl_comm_memory_bytes{comm="world",kind="symmetric_mapped",rank="1"} 0
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want),
		"gccl_coll_ops_total", "gccl_coll_bytes_total", "gccl_comm_aborted", "gccl_comm_memory_bytes"); err != nil {
		t.Fatal(err)
	}
	checkHistogramCounts(t, col, "gccl_coll_latency_seconds", map[string]uint64{"AllReduce": 3, "Barrier": 1}, "collective")
	onAll(t, cs, allReduce)
	if got := value(t, col, "gccl_coll_ops_total", map[string]string{"rank": "0", "collective": "AllReduce"}); got != 4 {
		t.Fatalf("rank 0's all-reduce counter at %v after a fourth", got)
	}
	// An abort shows.
	cs[1].Abort(nil)
	if err := testutil.CollectAndCompare(col, strings.NewReader(`
# HELP gccl_comm_aborted 1 once the communicator aborted.
# TYPE gccl_comm_aborted gauge
gccl_comm_aborted{comm="world",rank="0"} 0
gccl_comm_aborted{comm="world",rank="1"} 1
`), "gccl_comm_aborted"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.CollectAndLint(col); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	col.RemoveComm(cs[0])
	col.RemoveComm(cs[1])
	if n := testutil.CollectAndCount(col); n != 0 {
		t.Fatalf("%d series after removing every communicator", n)
	}
}

// value is the value of the counter or gauge name whose labels include
// those given (-1: no such series).
func value(t *testing.T, col prometheus.Collector, name string, labels map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				if label(m, k) != v {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// checkHistogramCounts checks that the histogram name has, per value of
// the label key, the sample count given.
func checkHistogramCounts(t *testing.T, col prometheus.Collector, name string, want map[string]uint64, key string) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			k := label(m, key)
			if h.GetSampleCount() != want[k] {
				t.Errorf("%s{%s=%q}: %d samples, want %d", name, key, k, h.GetSampleCount(), want[k])
			}
			last := uint64(0)
			for _, b := range h.GetBucket() {
				if b.GetCumulativeCount() < last || b.GetCumulativeCount() > h.GetSampleCount() {
					t.Errorf("%s{%s=%q}: buckets not cumulative: %v", name, key, k, h.GetBucket())
				}
				last = b.GetCumulativeCount()
			}
			seen++
		}
	}
	if seen == 0 {
		t.Errorf("no %s series", name)
	}
}

// TestAgentCounters: p2p posts show per backend and op, with the agent's
// memory.
func TestAgentCounters(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	cfg := p2p.Config{ListenAddr: "127.0.0.1:0", DisableSHM: true, DisablePVM: true, Logger: quiet}
	a, err := p2p.New("a", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := p2p.New("b", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	src, dst := make([]byte, 8192), make([]byte, 8192)
	lr, err := a.RegisterMem(src)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := b.RegisterMem(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadRemote(bg, b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	req, err := a.CreateRequest(p2p.Write, p2p.DescList{Type: p2p.DRAM, Descs: []p2p.Desc{lr.Desc(0, 8192)}}, "b",
		p2p.DescList{Type: p2p.DRAM, Descs: []p2p.Desc{tr.Desc(0, 8192)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer req.Release()
	for range 2 {
		if _, err := req.Post(); err != nil {
			t.Fatal(err)
		}
		if err := req.Wait(bg); err != nil {
			t.Fatal(err)
		}
	}
	col := New()
	col.AddAgent(a)
	const want = `
# HELP gccl_p2p_bytes_total Bytes moved by successful p2p posts.
# TYPE gccl_p2p_bytes_total counter
gccl_p2p_bytes_total{agent="a",backend="tcp",op="WRITE"} 16384
# HELP gccl_p2p_xfers_total Posts of p2p requests finished.
# TYPE gccl_p2p_xfers_total counter
gccl_p2p_xfers_total{agent="a",backend="tcp",op="WRITE"} 2
# HELP gccl_p2p_failed_total Posts of p2p requests that failed.
# TYPE gccl_p2p_failed_total counter
gccl_p2p_failed_total{agent="a",backend="tcp",op="WRITE"} 0
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want),
		"gccl_p2p_xfers_total", "gccl_p2p_bytes_total", "gccl_p2p_failed_total"); err != nil {
		t.Fatal(err)
	}
	checkHistogramCounts(t, col, "gccl_p2p_latency_seconds", map[string]uint64{"tcp": 2}, "backend")
	if err := testutil.CollectAndCompare(col, strings.NewReader(`
# HELP gccl_p2p_memory_bytes Memory a p2p agent holds or maps, by kind.
# TYPE gccl_p2p_memory_bytes gauge
gccl_p2p_memory_bytes{agent="a",kind="device"} 0
gccl_p2p_memory_bytes{agent="a",kind="pinned"} 0
gccl_p2p_memory_bytes{agent="a",kind="rdma_registered"} 0
gccl_p2p_memory_bytes{agent="a",kind="registered"} 8192
gccl_p2p_memory_bytes{agent="a",kind="shared"} 0
gccl_p2p_memory_bytes{agent="a",kind="shared_mapped"} 0
`), "gccl_p2p_memory_bytes"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.CollectAndLint(col); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}
