package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/gccl/gccl/comm"
)

// TestServeMetricsCountersMove: --metrics serves the ranks' counters over
// HTTP, and a scrape after more operations sees them grown; stop ends the
// server.
func TestServeMetricsCountersMove(t *testing.T) {
	comms, err := comm.InitLocal(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	var stderr bytes.Buffer
	stop, err := serveMetrics("127.0.0.1:0", 0, comms, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	m := regexp.MustCompile(`serving metrics at (http://\S+/metrics)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("stderr: %q", stderr.String())
	}
	url := m[1]
	allReduces := func(n int) {
		var wg sync.WaitGroup
		for _, c := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x := make([]float32, 256)
				for range n {
					if err := comm.AllReduce(context.Background(), c, x, x, comm.Sum); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	scrape := func() string {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
		}
		return string(b)
	}
	const series = `gccl_coll_ops_total{collective="AllReduce",comm="gccl-perf",rank="1",transport="INPROC"} `
	allReduces(3)
	if body := scrape(); !strings.Contains(body, series+"3\n") {
		t.Fatalf("after 3 all-reduces:\n%s", body)
	}
	allReduces(4)
	if body := scrape(); !strings.Contains(body, series+"7\n") {
		t.Fatalf("after 7 all-reduces:\n%s", body)
	}
	stop()
	if _, err := http.Get(url); err == nil {
		t.Fatal("the server still answers after stop")
	}
	stop = func() {}
}

func TestMetricsFlagNeedsHostPort(t *testing.T) {
	if _, err := serveMetrics("9400", 0, nil, io.Discard); err == nil {
		t.Fatal("--metrics 9400 accepted")
	}
}
