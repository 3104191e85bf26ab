package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// testFaultVar plants a fault in one rank of a multi-process run, for
// gccl-perf's own tests, which cannot reach into the rank processes
// otherwise:
//
//	corrupt@R  flip a bit of byte 13 (element 3 of a float) of rank R's
//	           in-place check outputs
//	exit@R     rank R exits with status exitFaultStatus at its first check
const testFaultVar = "GCCL_PERF_TEST_FAULT"

// exitFaultStatus is the exit status of a rank that an exit@R fault stops.
const exitFaultStatus = 3

// corruptElement is the 4-byte element a corrupt@R fault damages.
const corruptElement = 3

// testFault is a parsed GCCL_PERF_TEST_FAULT.
type testFault struct {
	kind string // "corrupt" or "exit"
	rank int
}

func parseTestFault(spec string) (testFault, error) {
	kind, rankText, ok := strings.Cut(spec, "@")
	rank, err := strconv.Atoi(rankText)
	if !ok || err != nil || rank < 0 || (kind != "corrupt" && kind != "exit") {
		return testFault{}, errors.New("want corrupt@RANK or exit@RANK")
	}
	return testFault{kind: kind, rank: rank}, nil
}

// hook is the afterCheckOp hook that plants the fault; the exit fault says
// so on stderr first.
func (f testFault) hook(stderr io.Writer) func(rank int, inPlace bool, out []byte) {
	return func(rank int, inPlace bool, out []byte) {
		if rank != f.rank {
			return
		}
		switch {
		case f.kind == "exit":
			fmt.Fprintf(stderr, "gccl-perf: rank %d: exiting with status %d (%s=exit@%d)\n", rank, exitFaultStatus, testFaultVar, rank)
			os.Exit(exitFaultStatus)
		case inPlace && len(out) > corruptElement*4:
			out[corruptElement*4+1] ^= 0x40 // a bit of the element's second byte
		}
	}
}
