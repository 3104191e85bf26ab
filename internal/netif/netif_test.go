package netif

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseIfSpec(t *testing.T) {
	for _, c := range []struct {
		in   string
		want IfSpec
	}{
		{"", IfSpec{}},
		{"eth", IfSpec{Names: []string{"eth"}}},
		{" eth , ib ,", IfSpec{Names: []string{"eth", "ib"}}},
		{"^docker,lo", IfSpec{Exclude: true, Names: []string{"docker", "lo"}}},
		{"=eth0", IfSpec{Exact: true, Names: []string{"eth0"}}},
		{"^=eth0,eth1", IfSpec{Exclude: true, Exact: true, Names: []string{"eth0", "eth1"}}},
		{"^", IfSpec{Exclude: true}},
	} {
		got := ParseIfSpec(c.in)
		if got.Exclude != c.want.Exclude || got.Exact != c.want.Exact || !slices.Equal(got.Names, c.want.Names) {
			t.Errorf("ParseIfSpec(%q) = %+v, want %+v", c.in, got, c.want)
		}
		if again := ParseIfSpec(got.String()); again.String() != got.String() {
			t.Errorf("%q does not round-trip: %q", c.in, again.String())
		}
	}
}

func TestIfSpecMatch(t *testing.T) {
	for _, c := range []struct {
		spec, name string
		want       bool
	}{
		{"eth", "eth0", true},
		{"eth", "eth", true},
		{"eth", "veth0", false},
		{"eth,ib", "ib1", true},
		{"^docker,lo", "docker0", false},
		{"^docker,lo", "lo", false},
		{"^docker,lo", "eth0", true},
		{"=eth0", "eth0", true},
		{"=eth0", "eth01", false},
		{"=eth", "eth0", false},
		{"^=eth0", "eth0", false},
		{"^=eth0", "eth01", true},
		{"^", "anything", true},
		{"", "anything", false},
	} {
		if got := ParseIfSpec(c.spec).Match(c.name); got != c.want {
			t.Errorf("%q matches %q = %v, want %v", c.spec, c.name, got, c.want)
		}
	}
}

func fakeIf(name string, up bool, addrs ...string) Interface {
	it := Interface{Name: name}
	if up {
		it.Flags = net.FlagUp
	}
	for _, a := range addrs {
		it.Addrs = append(it.Addrs, netip.MustParseAddr(a))
	}
	it.Addrs = usableAddrs(it.Addrs)
	return it
}

func names(ifs []Interface) string {
	var s []string
	for _, it := range ifs {
		s = append(s, it.Name)
	}
	return strings.Join(s, ",")
}

func TestSelectFrom(t *testing.T) {
	host := []Interface{
		fakeIf("lo", true, "127.0.0.1", "::1"),
		fakeIf("eth0", true, "fe80::1", "2001:db8::2", "10.0.0.2"),
		fakeIf("eth1", true, "10.0.1.2"),
		fakeIf("docker0", true, "172.17.0.1"),
		fakeIf("ib0", true, "fd00::3"),
		fakeIf("eth2", false, "10.0.2.2"),   // down
		fakeIf("eth3", true),                // no address
		fakeIf("eth4", true, "fe80::4"),     // link-local only: needs a zone
		fakeIf("veth9", true, "10.9.9.9"),   // not "eth" by prefix
		fakeIf("virbr0", true, "192.0.2.1"), // not excluded by default
	}
	for _, c := range []struct {
		spec, want string // want "" means an error
	}{
		{"", "eth0,eth1,ib0,veth9,virbr0"},
		{"eth", "eth0,eth1"},
		{"eth,ib", "eth0,eth1,ib0"},
		{"^docker,lo,virbr", "eth0,eth1,ib0,veth9"},
		{"=eth1", "eth1"},
		{"=eth", ""},
		{"^=eth0", "lo,eth1,docker0,ib0,veth9,virbr0"},
		{"=eth2", ""}, // down
		{"=eth3", ""}, // no usable address
		{"=eth4", ""},
		{"docker", "docker0"},
		{"wlan", ""},
	} {
		got, err := selectFrom(c.spec, host)
		if c.want == "" {
			if err == nil {
				t.Errorf("spec %q selected %s, want an error", c.spec, names(got))
			}
			continue
		}
		if err != nil || names(got) != c.want {
			t.Errorf("spec %q selected %s (%v), want %s", c.spec, names(got), err, c.want)
		}
	}
	// IPv4 is preferred, IPv6 used when it is all there is.
	got, _ := selectFrom("=eth0", host)
	if a := got[0].Addr(); a != netip.MustParseAddr("10.0.0.2") || len(got[0].Addrs) != 2 {
		t.Errorf("eth0 binds %v (addresses %v), want 10.0.0.2 then 2001:db8::2", a, got[0].Addrs)
	}
	got, _ = selectFrom("ib", host)
	if a := got[0].Addr(); a != netip.MustParseAddr("fd00::3") {
		t.Errorf("ib0 binds %v", a)
	}

	// Without other interfaces the default falls back to docker, then lo.
	fallback := []Interface{host[0], host[3]}
	if got, err := selectFrom("", fallback); err != nil || names(got) != "docker0" {
		t.Errorf("fallback selected %s (%v), want docker0", names(got), err)
	}
	if got, err := selectFrom("", host[:1]); err != nil || names(got) != "lo" {
		t.Errorf("fallback selected %s (%v), want lo", names(got), err)
	}
	if _, err := selectFrom("", nil); err == nil {
		t.Error("no interfaces at all gave no error")
	}
}

func TestSelectOnThisHost(t *testing.T) {
	ifs, err := Select("=lo")
	if err != nil {
		t.Skipf("no loopback interface here: %v", err)
	}
	if ifs[0].Name != "lo" || !ifs[0].Addr().IsLoopback() || !ifs[0].Addr().Is4() {
		t.Fatalf("=lo selected %+v", ifs)
	}
	if _, err := Select(""); err != nil {
		t.Fatalf("default selection failed: %v", err)
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv(EnvVar, "^docker,lo")
	if got := FromEnv(); got != "^docker,lo" {
		t.Fatalf("FromEnv() = %q", got)
	}
}
