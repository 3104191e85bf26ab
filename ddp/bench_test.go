package ddp_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/ddp"
)

// BenchmarkOverlap measures how much of the gradient communication the
// Reducer hides behind a backward pass. The fake backward pass produces
// one layer's gradient (1 Mi float32, 4 MiB) every pace, as a GPU would,
// sleeping meanwhile, from the last layer to the first, on 2 in-process
// ranks. "overlap" marks each layer ready as it is produced, as a trainer
// does; "serial" marks them all at the end, the communication of a
// trainer that all-reduces after its backward pass. Per step it reports
// the time (step-ms), the backward pass alone (compute-ms), the bucket
// all-reduces (comm-ms), the time Wait blocked (exposed-ms), the
// end-of-step agreement round (check-ms) and Stats.Overlap (overlap-%).
//
//	go test -run '^$' -bench Overlap -benchtime 20x ./ddp
func BenchmarkOverlap(b *testing.B) {
	const layers, elems, pace = 8, 1 << 20, 8 * time.Millisecond
	for _, sym := range []bool{false, true} {
		for _, mode := range []string{"overlap", "serial"} {
			b.Run(fmt.Sprintf("symmetric=%v/%s", sym, mode), func(b *testing.B) {
				cs := world(b, 2)
				sizes := make([]int, layers)
				for i := range sizes {
					sizes[i] = elems
				}
				// Buckets of two layers (8 MiB), the first of one.
				rs := reducers(b, cs, sizes, &ddp.Config{BucketBytes: 8 << 20, FirstBucketBytes: 4 << 20, Symmetric: sym})
				b.SetBytes(int64(4 * layers * elems))
				b.ResetTimer()
				start := time.Now()
				noErrors(b, onAll(b, cs, func(c *comm.Comm) error {
					r := rs[c.Rank()]
					for s := 0; s < b.N; s++ {
						t0 := time.Now()
						for k, i := 0, layers-1; i >= 0; k, i = k+1, i-1 {
							time.Sleep(time.Until(t0.Add(time.Duration(k+1) * pace)))
							g := r.Grad(i)
							g[0], g[len(g)-1] = float32(s), float32(i)
							if mode == "overlap" {
								if err := r.MarkReady(i); err != nil {
									return err
								}
							}
						}
						if mode == "serial" {
							for i := layers - 1; i >= 0; i-- {
								if err := r.MarkReady(i); err != nil {
									return err
								}
							}
						}
						if err := r.Wait(bg); err != nil {
							return err
						}
					}
					return nil
				}))
				elapsed := time.Since(start)
				b.StopTimer()
				s := rs[0].Stats()
				perStep := func(d time.Duration) float64 { return float64(d) / float64(b.N) / 1e6 }
				b.ReportMetric(perStep(elapsed), "step-ms")
				b.ReportMetric(float64(layers*pace)/1e6, "compute-ms")
				b.ReportMetric(perStep(s.Comm), "comm-ms")
				b.ReportMetric(perStep(s.Blocked), "exposed-ms")
				b.ReportMetric(perStep(s.Check), "check-ms")
				b.ReportMetric(100*s.Overlap(), "overlap-%")
			})
		}
	}
}
