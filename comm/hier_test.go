package comm_test

import (
	"fmt"
	"testing"

	"github.com/gccl/gccl/comm"
)

// hostsOf places n ranks on n/perHost pretend hosts, contiguously or
// round-robin.
func hostsOf(n, perHost int, strided bool) []string {
	hosts := make([]string, n)
	for r := range hosts {
		h := r / perHost
		if strided {
			h = r % (n / perHost)
		}
		hosts[r] = fmt.Sprintf("host%d", h)
	}
	return hosts
}

// TestHierarchical runs the hierarchical all-reduce and all-gather through
// the matrix's cases on in-process ranks placed on pretend hosts.
func TestHierarchical(t *testing.T) {
	layouts := []struct {
		n, perHost int
		strided    bool
	}{{4, 2, false}, {6, 2, true}, {6, 3, false}, {8, 4, true}}
	sizes := []int{0, 1, 7, 4097}
	types := comm.DataTypes
	if testing.Short() || raceEnabled {
		layouts, types = layouts[:2], []comm.DataType{comm.Float32, comm.BFloat16, comm.Int32, comm.Float8E4M3}
	}
	for _, lay := range layouts {
		cs := world(t, lay.n, &comm.Config{Algo: "hier"})
		comm.SetHosts(cs, hostsOf(lay.n, lay.perHost, lay.strided))
		if got := comm.Algo(cs[0], "AllReduce", 8); got != "Hier" {
			t.Fatalf("forced hier on %+v runs %s", lay, got)
		}
		// Every collective: all-reduce and all-gather go hierarchical,
		// the others fall back to their flat schedules.
		checkCollectives(t, cs, types, sizes, fmt.Sprintf("%+v", lay))
	}
}

// checkCollectives runs every case of the matrix on cs for the given types
// and sizes, every op, in and out of place.
func checkCollectives(t *testing.T, cs []*comm.Comm, types []comm.DataType, sizes []int, label string) {
	t.Helper()
	n := len(cs)
	for _, cc := range collCases {
		for _, dt := range types {
			for _, size := range sizes {
				ops := []comm.Op{{}}
				if cc.reducing {
					ops = matrixOps()
				}
				for _, op := range ops {
					cnt := elemsFor(size, dt)
					ins := make([][]byte, n)
					for p := range ins {
						ins[p] = make([]byte, inputLen(cc.name, n, cnt)*dt.Size())
						fill(dt, op, n, p, ins[p])
					}
					var ref *expected
					if cc.reducing {
						ref = expect(dt, op, ins)
					}
					for _, inPlace := range []bool{false, true} {
						errs := onAll(t, cs, func(c *comm.Comm) error {
							return cc.run(c, cnt, ins, ref, dt, op, inPlace)
						})
						for r, err := range errs {
							if err != nil {
								t.Fatalf("%s %s %v %v count=%d inPlace=%v: rank %d: %v", label, cc.name, dt, op, cnt, inPlace, r, err)
							}
						}
					}
				}
			}
		}
	}
}

// TestTunerChoosesHierarchical: all-reduces and all-gathers of every size go
// hierarchical on several hosts (it was the fastest from 8 B up, measured),
// other collectives keep theirs, and a single host or uneven hosts keep the
// flat schedules.
func TestTunerChoosesHierarchical(t *testing.T) {
	cs := world(t, 4, nil)
	comm.SetHosts(cs, hostsOf(4, 2, false))
	for _, tc := range []struct {
		coll  string
		bytes int
		want  string
	}{
		{"AllReduce", 8, "Hier"},
		{"AllReduce", 1 << 20, "Hier"},
		{"AllGather", 1 << 20, "Hier"},
		{"AllGather", 8, "Hier"},
		{"Broadcast", 1 << 20, "Ring"},
	} {
		if got := comm.Algo(cs[0], tc.coll, tc.bytes); got != tc.want {
			t.Errorf("%s of %d bytes on 2 hosts x 2: %s, want %s", tc.coll, tc.bytes, got, tc.want)
		}
	}
	for _, hosts := range [][]string{{"a", "a", "a", "a"}, {"a", "b", "c", "d"}, {"a", "a", "a", "b"}} {
		comm.SetHosts(cs, hosts)
		if got := comm.Algo(cs[0], "AllReduce", 1<<20); got != "Ring" {
			t.Errorf("hosts %v: %s, want Ring", hosts, got)
		}
	}
}

// TestRingOrder lays the rings over a permuted order, as the topology does
// when a host's ranks are not numbered consecutively: every collective
// stays right.
func TestRingOrder(t *testing.T) {
	types := []comm.DataType{comm.Float32, comm.Int64, comm.BFloat16}
	if testing.Short() || raceEnabled {
		types = types[:1]
	}
	cs := world(t, 5, &comm.Config{Algo: "ring"})
	if err := comm.SetRingOrder(cs, []int{3, 0, 4, 1, 2}); err != nil {
		t.Fatal(err)
	}
	checkCollectives(t, cs, types, []int{0, 1, 7, 4097}, "order [3 0 4 1 2]")
	if err := comm.SetRingOrder(cs, []int{0, 1, 1, 2, 3}); err == nil {
		t.Error("a ring order that is not a permutation was accepted")
	}
}
