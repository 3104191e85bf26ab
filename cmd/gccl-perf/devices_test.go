package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func devicesWithVia(vias ...string) []rankInfo {
	devices := make([]rankInfo, len(vias))
	for r, v := range vias {
		devices[r] = rankInfo{Rank: r, Pid: 100 + r, Host: "h", Via: strings.Split(v, ",")}
	}
	return devices
}

func TestTransportLines(t *testing.T) {
	for _, tc := range []struct {
		devices []rankInfo
		want    []string
	}{
		{devicesWithVia(",SHM", "SHM,"), []string{"all pairs via SHM"}},
		{devicesWithVia(",TCP,TCP", "TCP,,TCP", "TCP,TCP,"), []string{"all pairs via TCP"}},
		{devicesWithVia(""), nil},
		// Two hosts of two ranks: shared memory inside, TCP across.
		{devicesWithVia(",SHM,TCP,TCP", "SHM,,TCP,TCP", "TCP,TCP,,SHM", "TCP,TCP,SHM,"), []string{
			"rank 0 -> 1 SHM, 2-3 TCP",
			"rank 1 -> 0 SHM, 2-3 TCP",
			"rank 2 -> 0-1 TCP, 3 SHM",
			"rank 3 -> 0-1 TCP, 2 SHM",
		}},
	} {
		if got := transportLines(tc.devices); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("transportLines(%v) = %q, want %q", tc.devices, got, tc.want)
		}
	}
}

func TestTransportNames(t *testing.T) {
	mixed := devicesWithVia(",SHM,TCP", "SHM,,TCP", "TCP,TCP,")
	if got := strings.Join(mixed[0].transports(), "+"); got != "SHM+TCP" {
		t.Errorf("rank 0 uses %s, want SHM+TCP", got)
	}
	if got := strings.Join(mixed[2].transports(), "+"); got != "TCP" {
		t.Errorf("rank 2 uses %s, want TCP", got)
	}
	if got := jobTransports(mixed); got != "SHM+TCP" {
		t.Errorf("job uses %s, want SHM+TCP", got)
	}
	// A lone rank moves data only inside its process.
	if got := jobTransports(devicesWithVia("")); got != "INPROC" {
		t.Errorf("a single rank uses %s, want INPROC", got)
	}
}

// Records of different lengths survive the trip through fixed-size slots.
func TestRankRecordsRoundTrip(t *testing.T) {
	want := devicesWithVia(",SHM,TCP", "SHM,,TCP", "TCP,TCP,")
	want[1].Host = "a-much-longer-host-name.example.org"
	var recs [][]byte
	longest := 0
	for _, d := range want {
		rec, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
		longest = max(longest, len(rec))
	}
	slot := recordLengthBytes + longest
	var gathered []byte
	for _, rec := range recs {
		gathered = append(gathered, packRecord(rec, slot)...)
	}
	got, err := unpackRankInfos(gathered, slot)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip gave %+v, want %+v", got, want)
	}

	// Damaged input is reported, not misread.
	if _, err := unpackRankInfos(gathered[:len(gathered)-1], slot); err == nil {
		t.Error("a truncated gather was accepted")
	}
	overlong := append([]byte(nil), gathered...)
	overlong[0] = 0xff
	if _, err := unpackRankInfos(overlong, slot); err == nil || !strings.Contains(err.Error(), "more than its slot") {
		t.Errorf("an overlong record: %v", err)
	}
	swapped := append(append([]byte(nil), gathered[slot:2*slot]...), gathered[:slot]...)
	if _, err := unpackRankInfos(swapped, slot); err == nil || !strings.Contains(err.Error(), "record 0 describes rank 1") {
		t.Errorf("records out of order: %v", err)
	}
}
