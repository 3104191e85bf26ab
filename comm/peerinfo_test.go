package comm

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestPeerInfoRoundTrip(t *testing.T) {
	p := peerInfo{Version: Version, HostID: "h-1", Pid: 4242, Shm: "/dev/shm/gccl-ab-3", TCP: "10.0.0.1:1234",
		Topo: []byte(`<system version="1"><cpu numaid="0"/></system>`)}
	for _, p := range []peerInfo{p, {Version: Version, HostID: "h-2", Pid: 1}} {
		q, err := unmarshalPeerInfo(p.marshal())
		if err != nil || !reflect.DeepEqual(q, p) {
			t.Fatalf("round trip: %+v, %v", q, err)
		}
	}
	for _, bad := range [][]byte{nil, []byte("nope"), p.marshal()[:10], append(p.marshal(), 0)} {
		if _, err := unmarshalPeerInfo(bad); !errors.Is(err, errBadPeerInfo) {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}

func FuzzPeerInfo(f *testing.F) {
	f.Add((&peerInfo{Version: Version, HostID: "h", Pid: 1}).marshal())
	f.Add([]byte(peerInfoMagic + "\xff\xff\xff\xff\x0f"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := unmarshalPeerInfo(b)
		if err != nil {
			return
		}
		q, err := unmarshalPeerInfo(p.marshal())
		if err != nil || !reflect.DeepEqual(q, p) {
			t.Fatalf("re-encoding %+v gave %+v, %v", p, q, err)
		}
	})
}

func TestChooseRoutes(t *testing.T) {
	info := func(host string) peerInfo {
		return peerInfo{Version: Version, HostID: host, Shm: "shm-" + host, TCP: host + ":1"}
	}
	// Two hosts with two ranks each: shm inside, tcp across.
	infos := []peerInfo{info("a"), info("a"), info("b"), info("b")}
	rc, err := chooseRoutes(0, infos, false, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []route{routeNone, routeSHM, routeTCP, routeTCP}
	for p, r := range rc.routes {
		if r != want[p] {
			t.Errorf("route to %d = %v, want %v", p, r, want[p])
		}
	}
	if len(rc.downgrade) != 0 || !strings.Contains(strings.Join(rc.infos, "\n"), "rank 0 -> 1 via SHM") {
		t.Errorf("logs: %v %v", rc.infos, rc.downgrade)
	}

	// GCCL_SHM_DISABLE=1: same-host peers go over TCP, with a WARN.
	rc, err = chooseRoutes(0, infos, true, false)
	if err != nil || rc.routes[1] != routeTCP || len(rc.downgrade) != 1 || !strings.Contains(rc.downgrade[0], "GCCL_SHM_DISABLE=1") {
		t.Fatalf("shm disabled: %+v %v", rc, err)
	}
	// GCCL_STRICT=1 turns that downgrade into an error.
	if _, err := chooseRoutes(0, infos, true, true); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("strict: %v", err)
	}
	// A peer with nothing in common is unreachable.
	infos[3].TCP = ""
	if _, err := chooseRoutes(0, infos, false, false); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("unreachable peer: %v", err)
	}
	// Versions must agree.
	infos[3] = info("b")
	infos[2].Version = "9.9.9"
	if _, err := chooseRoutes(0, infos, false, false); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "9.9.9") {
		t.Fatalf("version mismatch: %v", err)
	}
}

func TestHostIDOverride(t *testing.T) {
	t.Setenv("GCCL_HOSTID", "node7")
	if HostID() != "node7" {
		t.Fatal("GCCL_HOSTID ignored")
	}
}

func TestEnvBytes(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want int
		ok   bool
		bad  bool
	}{{"", 0, false, false}, {"4096", 4096, true, false}, {"128K", 128 << 10, true, false}, {"2m", 2 << 20, true, false},
		{"1G", 1 << 30, true, false}, {"0", 0, false, true}, {"-5", 0, false, true}, {"12x", 0, false, true}, {"K", 0, false, true}} {
		t.Setenv("GCCL_TEST_BYTES", tc.v)
		got, ok, err := envBytes("GCCL_TEST_BYTES")
		if (err != nil) != tc.bad || got != tc.want || ok != tc.ok {
			t.Errorf("%q: %d, %v, %v", tc.v, got, ok, err)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: %v is not ErrInvalidArgument", tc.v, err)
		}
	}
}
