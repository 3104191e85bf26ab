package p2p

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestTelemetryRecordsEveryPost posts a WRITE of two parts and a READ on
// each backend and checks the agent's records, totals and telemetry file:
// one record per post, saying what ran.
func TestTelemetryRecordsEveryPost(t *testing.T) {
	for _, bc := range backendConfigs {
		t.Run(bc.name, func(t *testing.T) {
			skipWithout(t, bc.want)
			file := filepath.Join(t.TempDir(), "xfer-%r.jsonl")
			cfg := bc.cfg
			cfg.TelemetryFile = file
			a := newAgent(t, "a", cfg)
			b := newAgent(t, "b", bc.cfg)
			const size = 64 << 10
			tr := targetRegion(t, b, size, bc.heap)
			if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
				t.Fatal(err)
			}
			lr, err := a.RegisterMem(make([]byte, size))
			if err != nil {
				t.Fatal(err)
			}
			half := uint64(size / 2)
			w, err := a.CreateRequest(Write, one(DRAM, lr.Desc(0, half), lr.Desc(half, half)), "b",
				one(DRAM, tr.Desc(0, half), tr.Desc(half, half)),
				&RequestOptions{Parts: []Part{{End: 1}, {End: 2}}})
			if err != nil {
				t.Fatal(err)
			}
			r, err := a.CreateRequest(Read, one(DRAM, lr.Desc(0, 4096)), "b", one(DRAM, tr.Desc(0, 4096)), nil)
			if err != nil {
				t.Fatal(err)
			}
			type want struct {
				op    Op
				bytes uint64
				parts int
			}
			var wants []want
			for range 3 {
				for _, q := range []*Request{w, r} {
					if _, err := q.Post(); err != nil {
						t.Fatal(err)
					}
					if err := q.Wait(ctxT(t)); err != nil {
						t.Fatal(err)
					}
					wants = append(wants, want{q.op, q.Bytes(), len(q.parts)})
				}
			}
			st := a.Stats()
			if st.Xfers != uint64(len(wants)) || len(st.Recent) != len(wants) {
				t.Fatalf("Stats: %d posts, %d records; ran %d", st.Xfers, len(st.Recent), len(wants))
			}
			for i, rec := range st.Recent {
				if rec.N != uint64(i+1) || rec.Op != wants[i].op || rec.Bytes != wants[i].bytes || rec.Parts != wants[i].parts ||
					rec.PartsDone != rec.Parts || rec.Peer != "b" || rec.Backend != bc.want || rec.Failed || rec.End.Before(rec.Start) {
					t.Errorf("record %d: %+v; ran %+v on %v", i, rec, wants[i], bc.want)
				}
			}
			var xfers, bytes uint64
			for _, tot := range st.Totals {
				if tot.Backend != bc.want {
					t.Errorf("totals of %v: %+v", tot.Backend, tot)
				}
				xfers += tot.Xfers
				bytes += tot.Bytes
			}
			if xfers != 6 || bytes != 3*(size+4096) {
				t.Errorf("totals: %d posts, %d bytes; %+v", xfers, bytes, st.Totals)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(filepath.Join(filepath.Dir(file), "xfer-a.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			i := 0
			for ; sc.Scan(); i++ {
				var l struct {
					Agent, Op, Peer, Backend string
					N, Bytes                 uint64
					Parts                    int
					StartNs                  int64 `json:"start_ns"`
					EndNs                    int64 `json:"end_ns"`
				}
				if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
					t.Fatalf("%q: %v", sc.Text(), err)
				}
				if i >= len(wants) || l.Agent != "a" || l.N != uint64(i+1) || l.Op != wants[i].op.String() || l.Peer != "b" ||
					l.Backend != bc.want.String() || l.Bytes != wants[i].bytes || l.Parts != wants[i].parts || l.EndNs < l.StartNs {
					t.Errorf("line %d: %s", i, sc.Text())
				}
			}
			if i != len(wants) {
				t.Errorf("%d lines, ran %d posts", i, len(wants))
			}
		})
	}
}
