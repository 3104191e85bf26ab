package algo

import "strings"

// NumAlgorithms bounds the Algorithm values: an array indexed by Algorithm
// has this length (index 0, no algorithm, stays unused).
const NumAlgorithms = Doubling + 1

// ParseAlgorithm returns the algorithm named s, in any case: "ring",
// "tree", "pairwise", "direct", "hier" or "doubling" (GCCL_ALGO's
// spelling), or Algorithm.String's.
func ParseAlgorithm(s string) (Algorithm, bool) {
	for a := Ring; a < NumAlgorithms; a++ {
		if strings.EqualFold(s, a.String()) {
			return a, true
		}
	}
	return 0, false
}

// Name is the algorithm's name in lower case, as GCCL_ALGO and the cost
// model's tables spell it ("ring", "tree", "hier", ...).
func (a Algorithm) Name() string { return strings.ToLower(a.String()) }
