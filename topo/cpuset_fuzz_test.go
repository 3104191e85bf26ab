package topo

import "testing"

// FuzzParseCPUList and FuzzParseCPUMask: sysfs and user CPU sets parse
// without panicking, and what parses prints back to an equal set.
func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0-3,8", "0", "", "1-", "4095", "0-1000000000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		set, err := ParseCPUList(s)
		if err != nil {
			return
		}
		again, err := ParseCPUList(set.String())
		if err != nil || !again.Equal(set) {
			t.Fatalf("%q parsed as %v, which parses as %v (%v)", s, set, again, err)
		}
	})
}

func FuzzParseCPUMask(f *testing.F) {
	for _, s := range []string{"ff", "00000000,0000000f", "", ",", "zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		set, err := ParseCPUMask(s)
		if err != nil {
			return
		}
		again, err := ParseCPUMask(set.Mask(0))
		if err != nil || !again.Equal(set) {
			t.Fatalf("%q parsed as %v, whose mask %q parses as %v (%v)", s, set, set.Mask(0), again, err)
		}
	})
}

// FuzzParseLinkSpeed: a document's link_speed parses without panicking to
// a finite, non-negative speed.
func FuzzParseLinkSpeed(f *testing.F) {
	for _, s := range []string{"16.0 GT/s PCIe", "2.5 GT/s", "Unknown", "", "1e999 GT/s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseLinkSpeed(s)
		if err == nil && !(v >= 0 && v < 1e300) {
			t.Fatalf("%q parsed as %v", s, v)
		}
	})
}
