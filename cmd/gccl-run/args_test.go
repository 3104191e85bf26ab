package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseArgs(t *testing.T) {
	type want struct {
		nprocs           int
		nnodes, nodeRank int // -1: not given
		addr             string
		port             int // -1: not given
		tag              bool
		timeout, grace   time.Duration
		verbose          bool
		argv             string
	}
	ptr := func(p *int) int {
		if p == nil {
			return -1
		}
		return *p
	}
	tests := []struct {
		args []string
		want want
	}{
		{[]string{"-np", "4", "prog"},
			want{4, -1, -1, "", -1, true, 0, 3 * time.Second, false, "prog"}},
		{[]string{"-np=2", "--tag-output=false", "prog", "-np", "9", "--x"},
			want{2, -1, -1, "", -1, false, 0, 3 * time.Second, false, "prog -np 9 --x"}},
		{[]string{"--np", "2", "--tag-output", "false", "--", "-prog"},
			want{2, -1, -1, "", -1, false, 0, 3 * time.Second, false, "-prog"}},
		{[]string{"-np", "4", "--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "--master-port", "7000", "p"},
			want{4, 2, 0, "h", 7000, true, 0, 3 * time.Second, false, "p"}},
		{[]string{"--nproc_per_node=8", "--nnodes=3", "--node_rank=2", "--master_addr=h", "--master_port=1", "p"},
			want{8, 3, 2, "h", 1, true, 0, 3 * time.Second, false, "p"}},
		{[]string{"-np", "1", "--timeout", "90", "--kill-grace", "250ms", "-v", "p", "a b"},
			want{1, -1, -1, "", -1, true, 90 * time.Second, 250 * time.Millisecond, true, "p a b"}},
		{[]string{"-np", "1", "--timeout=1h30m", "--verbose", "p"},
			want{1, -1, -1, "", -1, true, 90 * time.Minute, 3 * time.Second, true, "p"}},
		{[]string{"-np", "1", "--timeout", "0.5", "p"},
			want{1, -1, -1, "", -1, true, 500 * time.Millisecond, 3 * time.Second, false, "p"}},
		{[]string{"-np", "65536", "--kill-grace", "0", "p"},
			want{65536, -1, -1, "", -1, true, 0, 0, false, "p"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			o, err := parseArgs(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			got := want{o.flags.NProcs, ptr(o.flags.NNodes), ptr(o.flags.NodeRank), o.flags.MasterAddr,
				ptr(o.flags.MasterPort), o.tagOutput, o.timeout, o.killGrace, o.verbose, strings.Join(o.argv, " ")}
			if got != tt.want {
				t.Errorf("parseArgs =\n  %+v\nwant\n  %+v", got, tt.want)
			}
		})
	}
}

func TestParseArgsRejects(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"prog"}, "-np (ranks per node) is required"},
		{[]string{"-np", "-2", "prog"}, "at least 1"},
		{[]string{"-np", "2"}, "no program to run"},
		{[]string{"-np", "two", "prog"}, "invalid value"},
		{[]string{"-np", "2", "--tag-output", "prog"}, "want true or false"},
		{[]string{"-np", "2", "--timeout", "soon", "prog"}, "want a duration"},
		{[]string{"-np", "2", "--timeout", "-5", "prog"}, "must not be negative"},
		{[]string{"-np", "2", "--kill-grace", "-1s", "prog"}, "must not be negative"},
		{[]string{"-np", "2", "--timeout", "NaN", "prog"}, "want a duration"},
		{[]string{"-np", "2", "--timeout", "Inf", "prog"}, "longer than"},
		{[]string{"-np", "2", "--timeout", "1e-10", "prog"}, "shorter than 1ns"},
		{[]string{"-np", "2", "--bogus", "prog"}, "flag provided but not defined"},
		{[]string{"-np", "65537", "prog"}, "more than the 65536 ranks per node"},
		{[]string{"-np", "2147483647", "prog"}, "more than the 65536 ranks per node"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := parseArgs(tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseArgs error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestParseArgsKeepGoing(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"-np", "2", "p"}, false},
		{[]string{"-np", "2", "--keep-going", "p", "--keep-going"}, true},
	} {
		o, err := parseArgs(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if o.keepGoing != tc.want || len(o.argv) != len(tc.args)-2-btoi(tc.want) {
			t.Errorf("parseArgs(%q): keepGoing %v, argv %q", tc.args, o.keepGoing, o.argv)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
