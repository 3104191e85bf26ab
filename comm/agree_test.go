package comm_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/commtest"
)

// TestAllReduceRanksAgree checks that every rank ends an all-reduce with the
// same bits, whatever algorithm the tuner or the configuration picks, in
// place or not: data parallel replicas diverge if one rank's max is NaN and
// another's is not, or if their sums round differently.
func TestAllReduceRanksAgree(t *testing.T) {
	type setup struct {
		n       int
		algo    string
		perHost int // ranks on each pretend host; 0: one host
	}
	var setups []setup
	for _, n := range []int{2, 3, 4, 5, 8} {
		for _, algo := range []string{"", "ring", "tree"} {
			setups = append(setups, setup{n: n, algo: algo})
		}
	}
	for _, hl := range [][2]int{{2, 2}, {2, 3}, {3, 2}, {2, 4}} {
		setups = append(setups, setup{n: hl[0] * hl[1], perHost: hl[1]})
	}
	sizes := []int{1, 7, 300, 5000, 40000} // elements: 40000 floats run rings on 2 ranks
	if testing.Short() || raceEnabled {
		sizes = []int{1, 7, 5000}
	}
	for _, su := range setups {
		cs := world(t, su.n, &comm.Config{Algo: su.algo})
		name := fmt.Sprintf("n=%d/algo=%q", su.n, su.algo)
		if su.perHost > 0 {
			comm.SetHosts(cs, hostsOf(su.n, su.perHost, false))
			name = fmt.Sprintf("n=%d/%d hosts", su.n, su.n/su.perHost)
		}
		for _, dt := range []comm.DataType{comm.Float32, comm.Float64} {
			for _, elems := range sizes {
				for _, op := range []comm.Op{comm.Sum, comm.Prod, comm.Min, comm.Max} {
					for _, inPlace := range []bool{false, true} {
						name := fmt.Sprintf("%s/%v/%d/%v/in place %v (%s)", name, dt, elems, op, inPlace, comm.Algo(cs[0], "AllReduce", elems*dt.Size()))
						checkRanksAgree(t, cs, name, dt, elems, op, inPlace)
					}
				}
			}
		}
	}
}

func checkRanksAgree(t *testing.T, cs []*comm.Comm, name string, dt comm.DataType, elems int, op comm.Op, inPlace bool) {
	t.Helper()
	n := len(cs)
	ins, outs := make([][]byte, n), make([][]byte, n)
	for r := range n {
		ins[r] = make([]byte, elems*dt.Size())
		commtest.FillAgree(dt, ins[r], r)
		outs[r] = make([]byte, len(ins[r]))
		if inPlace {
			copy(outs[r], ins[r])
			ins[r] = outs[r]
		}
	}
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		r := c.Rank()
		return c.AllReduce(bg, comm.HostBytesOf(dt, ins[r]), comm.HostBytesOf(dt, outs[r]), op)
	}))
	for r := 1; r < n; r++ {
		if !bytes.Equal(outs[r], outs[0]) {
			i := firstDiff(outs[r], outs[0]) / dt.Size()
			sz := dt.Size()
			t.Errorf("%s: rank %d's element %d is %v (bytes %x), rank 0's is %v (%x)", name, r, i,
				getF(dt, outs[r], i), outs[r][i*sz:(i+1)*sz], getF(dt, outs[0], i), outs[0][i*sz:(i+1)*sz])
			return
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
