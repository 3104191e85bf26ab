package hostlist

import (
	"reflect"
	"testing"
)

func TestExpand(t *testing.T) {
	cases := map[string][]string{
		"node1":                  {"node1"},
		"gpu[01-03,7],login1":    {"gpu01", "gpu02", "gpu03", "gpu7", "login1"},
		"a[1-2]-ib":              {"a1-ib", "a2-ib"},
		"r[1-2]n[08-09]":         {"r1n08", "r1n09", "r2n08", "r2n09"},
		" x , y ":                {"x", "y"},
		"h[9-11]":                {"h9", "h10", "h11"},
		"compute-[000-002].site": {"compute-000.site", "compute-001.site", "compute-002.site"},
	}
	for in, want := range cases {
		got, err := Expand(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Expand(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if h, err := First("gpu[05-99],x"); err != nil || h != "gpu05" {
		t.Errorf("First = %q, %v", h, err)
	}
}

func TestExpandErrors(t *testing.T) {
	for _, in := range []string{"a[1-", "a]1", "a[3-1]", "a[x]", "a[1-]", "n[1-999999999]", "a[-1]"} {
		if got, err := Expand(in); err == nil {
			t.Errorf("Expand(%q) = %v, want an error", in, got)
		}
	}
	if _, err := First(""); err == nil {
		t.Error("First of an empty list")
	}
}

func FuzzExpand(f *testing.F) {
	for _, s := range []string{"gpu[01-03,7],login1", "r[1-2]n[08-09]", "a[", "]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hosts, err := Expand(s)
		if err == nil && len(hosts) > maxHosts {
			t.Fatalf("%d hosts", len(hosts))
		}
	})
}
