package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/tune"
)

// Without --topo-file, --simulate prices -np ranks on each of --nodes hosts
// of this machine class, and its algorithm column is the communicators'
// tuner's choice: the run-time choice and the table are one model.
func TestSimulateHost(t *testing.T) {
	const fieldAlgo = 13 // after the in-place #wrong
	for _, tc := range []struct {
		args    string
		perHost []int
		coll    algo.Collective
		scaled  bool
	}{
		{"all_reduce --simulate -np 8 -b 8 -e 64M -f 2", []int{8}, algo.AllReduce, false},
		{"all_reduce --simulate -np 8 -b 8 -e 64M -f 2 -o avg", []int{8}, algo.AllReduce, true},
		{"all_reduce --simulate -g 4 -b 8 -e 1M -f 2 -o mulsum", []int{4}, algo.AllReduce, true},
		{"all_reduce --simulate -np 2 --nodes 2 -b 8 -e 64M -f 4", []int{2, 2}, algo.AllReduce, false},
		{"all_gather --simulate -np 4 -b 8 -e 64M -f 2", []int{4}, algo.AllGather, false},
		{"broadcast --simulate -np 64 -b 8 -e 64M -f 2", []int{64}, algo.Broadcast, false},
	} {
		out, errOut, status := runMain(t, testEnvironment(), tc.args)
		if status != 0 {
			t.Fatalf("%s: exit status %d, stderr %s\n%s", tc.args, status, errOut, out)
		}
		if !strings.Contains(out, "# Predicted by gccl's cost model, not measured: this machine") {
			t.Errorf("%s: the table does not name this machine's model:\n%s", tc.args, out)
		}
		sys, err := tune.Host(tc.perHost...)
		if err != nil {
			t.Fatal(err)
		}
		tuner, err := tune.NewTuner(sys, 0)
		if err != nil {
			t.Fatal(err)
		}
		rows := tableRows(out)
		if len(rows) < 10 {
			t.Fatalf("%s: %d rows:\n%s", tc.args, len(rows), out)
		}
		for _, row := range rows {
			size, err := strconv.Atoi(row[fieldSize])
			if err != nil || len(row) <= fieldAlgo {
				t.Fatalf("%s: row %q", tc.args, row)
			}
			if tc.coll == algo.AllGather {
				size /= sys.Ranks() // the tuner takes each rank's block
			}
			if want := tuner.Choose(tc.coll, size, tc.scaled).Name(); row[fieldAlgo] != want {
				t.Errorf("%s: %s B: the table runs %s, the tuner %s", tc.args, row[fieldSize], row[fieldAlgo], want)
			}
		}
	}
}
