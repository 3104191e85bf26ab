// Package metrics exports gccl's telemetry to Prometheus: a Collector over
// communicators and p2p agents, which the program registers in its own
// registry and serves from its own HTTP server. gccl's core packages do not
// depend on Prometheus; only programs that import this package do.
//
//	col := metrics.New()
//	col.AddComm("world", c)             // label comm="world"
//	col.AddAgent(agent)
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(col)
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Every scrape reads each communicator's Stats, MemStats, Err and
// LostRanks and each agent's Stats and MemStats (comm.Comm.Stats,
// p2p.Agent.Stats): cumulative totals kept by gccl, so counters never go
// back and nothing is lost between scrapes. The metrics:
//
//	gccl_coll_ops_total{comm,rank,collective,transport}          operations run
//	gccl_coll_failed_total{comm,rank,collective,transport}       of which failed
//	gccl_coll_bytes_total{comm,rank,collective,transport}        their payload bytes
//	gccl_coll_latency_seconds{comm,rank,collective,transport}    histogram of their durations
//	gccl_comm_aborted{comm,rank}                                 1 once the communicator aborted
//	gccl_comm_lost_ranks{comm,rank}                              ranks the rendezvous declared lost
//	gccl_comm_memory_bytes{comm,rank,kind}                       ring_heap, ring_shared, ring_registered,
//	                                                             symmetric, symmetric_mapped, staging
//	gccl_p2p_xfers_total{agent,backend,op}                       posts finished
//	gccl_p2p_failed_total{agent,backend,op}                      of which failed
//	gccl_p2p_bytes_total{agent,backend,op}                       bytes of the successful ones
//	gccl_p2p_latency_seconds{agent,backend,op}                   histogram of their durations
//	gccl_p2p_memory_bytes{agent,kind}                            registered, shared, shared_mapped,
//	                                                             device, pinned, rdma_registered
//
// "collective" is an OpRecord's Kind (AllReduce, ..., Barrier, Send, Recv,
// Group, AllToAllV, AllGatherV).
package metrics

import (
	"errors"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/p2p"
)

// Collector is a prometheus.Collector over the communicators and agents
// added to it. Its methods are safe for concurrent use.
type Collector struct {
	mu     sync.Mutex
	comms  map[*comm.Comm]string
	agents map[*p2p.Agent]bool
}

// New returns a Collector over nothing yet.
func New() *Collector {
	return &Collector{comms: map[*comm.Comm]string{}, agents: map[*p2p.Agent]bool{}}
}

// AddComm exports c's metrics with the label comm=name (several ranks of
// one process, as InitLocal makes, are told apart by their rank label).
func (col *Collector) AddComm(name string, c *comm.Comm) {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.comms[c] = name
}

// RemoveComm stops exporting c (a communicator replaced by Shrink, say).
func (col *Collector) RemoveComm(c *comm.Comm) {
	col.mu.Lock()
	defer col.mu.Unlock()
	delete(col.comms, c)
}

// AddAgent exports a's metrics with the label agent=its name.
func (col *Collector) AddAgent(a *p2p.Agent) {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.agents[a] = true
}

// RemoveAgent stops exporting a.
func (col *Collector) RemoveAgent(a *p2p.Agent) {
	col.mu.Lock()
	defer col.mu.Unlock()
	delete(col.agents, a)
}

var (
	collLabels = []string{"comm", "rank", "collective", "transport"}
	commLabels = []string{"comm", "rank"}
	p2pLabels  = []string{"agent", "backend", "op"}

	collOps     = prometheus.NewDesc("gccl_coll_ops_total", "Operations a communicator ran.", collLabels, nil)
	collFailed  = prometheus.NewDesc("gccl_coll_failed_total", "Operations that failed (and aborted the communicator).", collLabels, nil)
	collBytes   = prometheus.NewDesc("gccl_coll_bytes_total", "Payload bytes of the operations (the larger of a rank's input and output).", collLabels, nil)
	collLatency = prometheus.NewDesc("gccl_coll_latency_seconds", "Durations of the operations on this rank, from its arrival.", collLabels, nil)
	commAborted = prometheus.NewDesc("gccl_comm_aborted", "1 once the communicator aborted.", commLabels, nil)
	commLost    = prometheus.NewDesc("gccl_comm_lost_ranks", "Ranks of the communicator declared lost.", commLabels, nil)
	commMemory  = prometheus.NewDesc("gccl_comm_memory_bytes", "Memory the communicator holds, by kind.", append(commLabels, "kind"), nil)
	p2pXfers    = prometheus.NewDesc("gccl_p2p_xfers_total", "Posts of p2p requests finished.", p2pLabels, nil)
	p2pFailed   = prometheus.NewDesc("gccl_p2p_failed_total", "Posts of p2p requests that failed.", p2pLabels, nil)
	p2pBytes    = prometheus.NewDesc("gccl_p2p_bytes_total", "Bytes moved by successful p2p posts.", p2pLabels, nil)
	p2pLatency  = prometheus.NewDesc("gccl_p2p_latency_seconds", "Durations of p2p posts.", p2pLabels, nil)
	p2pMemory   = prometheus.NewDesc("gccl_p2p_memory_bytes", "Memory a p2p agent holds or maps, by kind.", []string{"agent", "kind"}, nil)
)

// Describe sends the descriptors of every metric the Collector exports.
func (col *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{collOps, collFailed, collBytes, collLatency, commAborted, commLost, commMemory,
		p2pXfers, p2pFailed, p2pBytes, p2pLatency, p2pMemory} {
		ch <- d
	}
}

// Collect reads the communicators' and agents' figures now.
func (col *Collector) Collect(ch chan<- prometheus.Metric) {
	col.mu.Lock()
	comms := make(map[*comm.Comm]string, len(col.comms))
	for c, name := range col.comms {
		comms[c] = name
	}
	agents := make([]*p2p.Agent, 0, len(col.agents))
	for a := range col.agents {
		agents = append(agents, a)
	}
	col.mu.Unlock()
	for c, name := range comms {
		collectComm(ch, name, c)
	}
	for _, a := range agents {
		collectAgent(ch, a)
	}
}

func collectComm(ch chan<- prometheus.Metric, name string, c *comm.Comm) {
	st := c.Stats()
	rank := strconv.Itoa(st.Rank)
	for _, t := range st.Totals {
		labels := []string{name, rank, t.Kind, st.Transport}
		ch <- prometheus.MustNewConstMetric(collOps, prometheus.CounterValue, float64(t.Ops), labels...)
		ch <- prometheus.MustNewConstMetric(collFailed, prometheus.CounterValue, float64(t.Failed), labels...)
		ch <- prometheus.MustNewConstMetric(collBytes, prometheus.CounterValue, float64(t.Bytes), labels...)
		ch <- prometheus.MustNewConstHistogram(collLatency, t.Ops, t.Time.Seconds(),
			cumulative(t.Latency[:], comm.LatencyBounds[:]), labels...)
	}
	aborted := 0.0
	if err := c.Err(); err != nil && errors.Is(err, comm.ErrAborted) {
		aborted = 1
	}
	ch <- prometheus.MustNewConstMetric(commAborted, prometheus.GaugeValue, aborted, name, rank)
	ch <- prometheus.MustNewConstMetric(commLost, prometheus.GaugeValue, float64(len(c.LostRanks())), name, rank)
	m := c.MemStats()
	for _, k := range []struct {
		kind string
		n    int64
	}{{"ring_heap", m.RingHeap}, {"ring_shared", m.RingShared}, {"ring_registered", m.RingRegistered},
		{"symmetric", m.Symmetric}, {"symmetric_mapped", m.SymmetricMapped}, {"staging", m.Staging}} {
		ch <- prometheus.MustNewConstMetric(commMemory, prometheus.GaugeValue, float64(k.n), name, rank, k.kind)
	}
}

func collectAgent(ch chan<- prometheus.Metric, a *p2p.Agent) {
	st := a.Stats()
	for _, t := range st.Totals {
		labels := []string{st.Name, t.Backend.String(), t.Op.String()}
		ch <- prometheus.MustNewConstMetric(p2pXfers, prometheus.CounterValue, float64(t.Xfers), labels...)
		ch <- prometheus.MustNewConstMetric(p2pFailed, prometheus.CounterValue, float64(t.Failed), labels...)
		ch <- prometheus.MustNewConstMetric(p2pBytes, prometheus.CounterValue, float64(t.Bytes), labels...)
		ch <- prometheus.MustNewConstHistogram(p2pLatency, t.Xfers, t.Time.Seconds(),
			cumulative(t.Latency[:], p2p.LatencyBounds[:]), labels...)
	}
	m := a.MemStats()
	for _, k := range []struct {
		kind string
		n    int64
	}{{"registered", m.Registered}, {"shared", m.Shared}, {"shared_mapped", m.SharedMapped},
		{"device", m.Device}, {"pinned", m.Pinned}, {"rdma_registered", m.RDMARegistered}} {
		ch <- prometheus.MustNewConstMetric(p2pMemory, prometheus.GaugeValue, float64(k.n), st.Name, k.kind)
	}
}

// cumulative turns per-bucket counts (the last one past every bound) into
// Prometheus's cumulative buckets, keyed by upper bound in seconds; the
// +Inf bucket is the histogram's count.
func cumulative[D interface{ Seconds() float64 }](counts []uint64, bounds []D) map[float64]uint64 {
	out := make(map[float64]uint64, len(bounds))
	var sum uint64
	for i, b := range bounds {
		sum += counts[i]
		out[b.Seconds()] = sum
	}
	return out
}
