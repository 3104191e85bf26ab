package algo

import "testing"

func TestParseAlgorithm(t *testing.T) {
	for a := Ring; a < NumAlgorithms; a++ {
		for _, s := range []string{a.String(), a.Name()} {
			if got, ok := ParseAlgorithm(s); !ok || got != a {
				t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", s, got, ok, a)
			}
		}
	}
	if got := Hier.Name(); got != "hier" {
		t.Errorf("Hier.Name() = %q", got)
	}
	for _, s := range []string{"", "butterfly", "Algorithm(9)"} {
		if _, ok := ParseAlgorithm(s); ok {
			t.Errorf("ParseAlgorithm(%q) succeeded", s)
		}
	}
}
