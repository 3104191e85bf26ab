package ibverbs

import "testing"

// FuzzParseAddr and FuzzParsePairInfo: what a peer publishes about its
// port and sends about its connection is parsed without panicking.
func FuzzParseAddr(f *testing.F) {
	f.Add(make([]byte, 33))
	f.Add(append([]byte{addrVersion}, make([]byte, 40)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := parseAddr(b)
		if err == nil && a.QPs < 0 {
			t.Fatalf("%x parsed with %d QPs", b, a.QPs)
		}
	})
}

func FuzzParsePairInfo(f *testing.F) {
	f.Add([]byte(infoMagic + "\x00"))
	f.Add([]byte(infoMagic + "\x01failed"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parsePairInfo(b)
	})
}
