package bootstrap

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
)

// FuzzTasksOnNode feeds arbitrary Slurm per-node task lists: the parser
// must return an error or a positive count, never panic, and agree with a
// naive expansion when the list is small.
func FuzzTasksOnNode(f *testing.F) {
	for _, seed := range []string{"4", "2(x3),1", "1(x1000000000)", "2(3)", "(x)", "3(x", ",", "-1(x2)"} {
		f.Add(seed, 0)
		f.Add(seed, 3)
	}
	f.Fuzz(func(t *testing.T, spec string, node int) {
		n, err := tasksOnNode(spec, node)
		if err != nil {
			return
		}
		if n < 1 {
			t.Fatalf("tasksOnNode(%q, %d) = %d without error", spec, node, n)
		}
		// Naive expansion of lists with few nodes.
		var expanded []int
		for _, item := range strings.Split(spec, ",") {
			count, reps := item, 1
			if open := strings.IndexByte(item, '('); open >= 0 {
				count = item[:open]
				r, _ := strconv.Atoi(item[open+2 : len(item)-1])
				reps = r
			}
			c, _ := strconv.Atoi(count)
			if reps > 1000 {
				return // too long to expand; the parse itself was checked
			}
			for range reps {
				expanded = append(expanded, c)
			}
		}
		if node >= len(expanded) || expanded[node] != n {
			t.Fatalf("tasksOnNode(%q, %d) = %d, naive expansion %v", spec, node, n, expanded)
		}
	})
}

// FuzzSplitGroup feeds arbitrary Split contributions (wire data from other
// ranks): decoding must fail cleanly or return a group that contains self,
// shares self's color and is ordered by (key, rank).
func FuzzSplitGroup(f *testing.F) {
	valid := func(color, key int64) []byte {
		b, _ := proto.Marshal(&pb.SplitContribution{Color: color, Key: key})
		return b
	}
	f.Add(valid(0, 0), valid(0, 1), valid(1, 0), uint8(0))
	f.Add(valid(1, 5), valid(-1, 0), valid(1, -5), uint8(2))
	f.Add([]byte{0xff}, valid(0, 0), []byte(nil), uint8(1))
	f.Add(valid(-7, 0), []byte(nil), []byte(nil), uint8(1))
	f.Fuzz(func(t *testing.T, a, b, c []byte, self uint8) {
		contributions := [][]byte{a, b, c}
		group, err := splitGroup(contributions, int(self))
		if err != nil {
			return
		}
		if int(self) >= len(contributions) {
			t.Fatalf("self %d accepted with %d contributions", self, len(contributions))
		}
		decode := func(r int) *pb.SplitContribution {
			var sc pb.SplitContribution
			if err := proto.Unmarshal(contributions[r], &sc); err != nil {
				t.Fatalf("rank %d's contribution was accepted but does not decode: %v", r, err)
			}
			return &sc
		}
		mine := decode(int(self))
		if mine.Color == NoColor {
			if group != nil {
				t.Fatalf("NoColor got group %v", group)
			}
			return
		}
		if !slices.Contains(group, int(self)) {
			t.Fatalf("group %v lacks self %d", group, self)
		}
		for i, r := range group {
			sc := decode(r)
			if sc.Color != mine.Color {
				t.Fatalf("group %v holds rank %d of color %d, self has %d", group, r, sc.Color, mine.Color)
			}
			if i > 0 {
				prev := decode(group[i-1])
				if prev.Key > sc.Key || (prev.Key == sc.Key && group[i-1] > r) {
					t.Fatalf("group %v not ordered by (key, rank)", group)
				}
			}
		}
		for r := range contributions {
			if decode(r).Color == mine.Color && !slices.Contains(group, r) {
				t.Fatalf("group %v lacks rank %d of the same color", group, r)
			}
		}
	})
}
