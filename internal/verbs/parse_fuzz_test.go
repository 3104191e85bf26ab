package verbs

import "testing"

// FuzzParseGID and FuzzParseHCAFilter: a GID from sysfs and a GCCL_IB_HCA
// value parse without panicking; a parsed GID prints back to itself.
func FuzzParseGID(f *testing.F) {
	for _, s := range []string{"fe80:0000:0000:0000:0202:c9ff:fe00:0001", "::1", "", "zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseGID(s)
		if err != nil {
			return
		}
		if again, err := ParseGID(g.String()); err != nil || again != g {
			t.Fatalf("%q parsed as %v, which parses as %v (%v)", s, g, again, err)
		}
	})
}

func FuzzParseHCAFilter(f *testing.F) {
	for _, s := range []string{"mlx5_0:1,mlx5_1", "^=mlx5_2", "", ":", "a:99999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ParseHCAFilter(s)
	})
}
