package comm

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gccl/gccl/topo"
)

func TestPeerInfoRoundTrip(t *testing.T) {
	p := peerInfo{Version: Version, HostID: "h-1", Pid: 4242, CPUs: 96, CPUList: "0-47,96-143", Transports: []byte("gcclTD1\x00"),
		Topo: []byte(`<system version="1"><cpu numaid="0"/></system>`)}
	for _, p := range []peerInfo{p, {Version: Version, HostID: "h-2", Pid: 1}} {
		q, err := unmarshalPeerInfo(p.marshal())
		if err != nil || !reflect.DeepEqual(q, p) {
			t.Fatalf("round trip: %+v, %v", q, err)
		}
	}
	badList := p
	badList.CPUList = "3-1"
	for _, bad := range [][]byte{nil, []byte("nope"), p.marshal()[:10], append(p.marshal(), 0), badList.marshal()} {
		if _, err := unmarshalPeerInfo(bad); !errors.Is(err, errBadPeerInfo) {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}

func FuzzPeerInfo(f *testing.F) {
	f.Add((&peerInfo{Version: Version, HostID: "h", Pid: 1}).marshal())
	f.Add((&peerInfo{Version: Version, HostID: "h", Pid: 1, Transports: []byte("t"), Topo: []byte("<x/>")}).marshal())
	f.Add((&peerInfo{Version: Version, HostID: "h", Pid: 1, CPUs: 4, CPUList: "0-1,3"}).marshal())
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

// The transport choice per pair is tested in package transport
// (TestSelectRoutes); versions are checked here, before it.
func TestCheckVersions(t *testing.T) {
	infos := []peerInfo{{Version: Version, HostID: "a"}, {Version: Version, HostID: "b"}, {Version: Version, HostID: "b"}}
	if err := checkVersions(0, infos); err != nil {
		t.Fatal(err)
	}
	// Versions must agree.
	infos[2].Version = "9.9.9"
	if err := checkVersions(0, infos); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "9.9.9") {
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

// TestCrowded: a host is crowded when its ranks outnumber the union of
// their CPU lists; where a rank did not list its CPUs, when they outnumber
// the smallest count of any of its ranks. Other hosts do not count.
func TestCrowded(t *testing.T) {
	counts := []peerInfo{{HostID: "a", CPUs: 2}, {HostID: "a", CPUs: 8}, {HostID: "b", CPUs: 1}, {HostID: "a"}}
	// Host c: a launcher bound each rank to its own core of two. Host d:
	// two ranks bound to the same core. Host e: one rank lists its CPUs,
	// the other does not (the counts decide).
	lists := []peerInfo{
		{HostID: "c", CPUs: 1, CPUList: "0"}, {HostID: "c", CPUs: 1, CPUList: "1"},
		{HostID: "d", CPUs: 1, CPUList: "5"}, {HostID: "d", CPUs: 1, CPUList: "5"},
		{HostID: "e", CPUs: 2, CPUList: "0-1"}, {HostID: "e", CPUs: 4},
	}
	for _, tc := range []struct {
		infos []peerInfo
		host  string
		ranks int
		want  bool
	}{
		{counts, "a", 2, false}, {counts, "a", 3, true}, {counts, "b", 1, false}, {counts, "b", 2, true}, {counts, "c", 9, false},
		{lists, "c", 2, false}, {lists, "c", 3, true}, {lists, "d", 2, true}, {lists, "d", 1, false},
		{lists, "e", 2, false}, {lists, "e", 3, true},
	} {
		if got := crowded(tc.infos, tc.host, tc.ranks); got != tc.want {
			t.Errorf("crowded(%s, %d) = %v, want %v", tc.host, tc.ranks, got, tc.want)
		}
	}
}

// TestCPUListIsThisProcessMask: the list a rank publishes names as many
// CPUs as it may run on, where the platform says which.
func TestCPUListIsThisProcessMask(t *testing.T) {
	cpus, err := inheritedCPUs()
	if err != nil {
		if cpuList() != "" {
			t.Fatalf("cpuList() = %q where the mask is unknown (%v)", cpuList(), err)
		}
		t.Skip(err)
	}
	set, err := topo.ParseCPUList(cpuList())
	if err != nil || set.Count() != len(cpus) || set.Count() == 0 {
		t.Fatalf("cpuList() = %q (%v), want the %d CPUs %v", cpuList(), err, len(cpus), cpus)
	}
}
