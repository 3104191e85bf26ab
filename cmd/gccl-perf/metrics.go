package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/metrics"
)

// serveMetrics is --metrics: it serves comms' metrics (package metrics) at
// http://addr/metrics until the returned stop runs. A rank of a job
// serves on addr's port plus its local rank, so that the ranks of one host
// can share one command line. An empty addr serves nothing.
func serveMetrics(addr string, localRank int, comms []*comm.Comm, stderr io.Writer) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics %q: %v", addr, err)
	}
	if p, err := strconv.Atoi(port); err == nil && p != 0 && localRank != 0 {
		addr = net.JoinHostPort(host, strconv.Itoa(p+localRank))
	}
	col := metrics.New()
	for _, c := range comms {
		col.AddComm("gccl-perf", c)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stderr, "gccl-perf: metrics server: %v\n", err)
		}
	}()
	fmt.Fprintf(stderr, "gccl-perf: serving metrics at http://%s/metrics\n", ln.Addr())
	return func() {
		srv.Close()
		<-done
	}, nil
}
