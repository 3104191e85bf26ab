package main

import (
	"math"
	"testing"
)

func TestBusBW(t *testing.T) {
	for _, tc := range []struct {
		test string
		n    int
		want float64
	}{
		{"all_reduce", 1, 0}, {"all_reduce", 2, 1}, {"all_reduce", 4, 1.5}, {"all_reduce", 8, 1.75},
		{"all_gather", 4, 0.75}, {"reduce_scatter", 4, 0.75}, {"alltoall", 4, 0.75},
		{"gather", 8, 0.875}, {"scatter", 2, 0.5},
		{"broadcast", 8, 1}, {"reduce", 8, 1}, {"sendrecv", 8, 1},
	} {
		if got := busBW(tc.test, tc.n); math.Abs(got-tc.want) > 1e-15 {
			t.Errorf("busBW(%s, %d) = %v, want %v", tc.test, tc.n, got, tc.want)
		}
	}
}

// The size and count columns and algbw's byte count, for a 1000-byte float
// size (250 elements) on 3 ranks, as nccl-tests computes them.
func TestLayoutsFollowNCCLTests(t *testing.T) {
	const n, typeSize, count = 3, 4, 250
	for _, tc := range []struct {
		test                  string
		send, recv, param     int
		sizeBytes, algBytes   int64
		sendInPlace, recvInPl int
	}{
		{"all_reduce", 250, 250, 250, 1000, 1000, 0, 0},
		{"broadcast", 250, 250, 250, 1000, 1000, 0, 0},
		{"reduce", 250, 250, 250, 1000, 1000, 0, 0},
		{"sendrecv", 250, 250, 250, 1000, 1000, 0, 0},
		// count rounds down to a multiple of n: 83 per rank, 249 in all.
		{"all_gather", 83, 249, 83, 996, 996, 83, 0},
		{"gather", 83, 249, 83, 996, 996, 83, 0},
		{"reduce_scatter", 249, 83, 83, 996, 996, 0, 83},
		{"scatter", 249, 83, 83, 996, 996, 0, 83},
		{"alltoall", 249, 249, 83, 996, 996, 0, 0},
	} {
		coll, err := lookupTest(tc.test)
		if err != nil {
			t.Fatal(err)
		}
		l := coll.layoutFor(count, n)
		if l.sendCount != tc.send || l.recvCount != tc.recv || l.paramCount != tc.param ||
			l.sendInPlaceOffset != tc.sendInPlace || l.recvInPlaceOffset != tc.recvInPl {
			t.Errorf("%s: layout %+v", tc.test, l)
		}
		if got := l.sizeBytes(typeSize); got != tc.sizeBytes {
			t.Errorf("%s: size column %d, want %d", tc.test, got, tc.sizeBytes)
		}
		if got := coll.algBytes(l, typeSize, n); got != tc.algBytes {
			t.Errorf("%s: algbw bytes %d, want %d", tc.test, got, tc.algBytes)
		}
	}
}

// Every output element of every rank must name a source inside the inputs.
func TestSourcesStayInBounds(t *testing.T) {
	const n, count = 3, 12
	for _, coll := range collectives {
		l := coll.layoutFor(count, n)
		for r := range n {
			for j := range l.recvCount {
				src, idx := coll.source(r, n, 1, l.paramCount, j)
				if (src != allRanks && (src < 0 || src >= n)) || idx < 0 || idx >= l.sendCount {
					t.Errorf("%s: rank %d element %d from rank %d element %d, outside %d ranks x %d inputs",
						coll.name, r, j, src, idx, n, l.sendCount)
				}
			}
		}
	}
}
