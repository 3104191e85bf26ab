package verbs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEndpointRoundTrip(t *testing.T) {
	e := roceRemote(t)
	e.LID = 0x1234
	b, err := e.MarshalBinary()
	require.NoError(t, err)
	require.Len(t, b, EndpointSize)
	var d Endpoint
	require.NoError(t, d.UnmarshalBinary(b))
	require.Equal(t, e, d)
	b2, _ := d.AppendBinary([]byte("x"))
	require.Equal(t, append([]byte("x"), b...), b2)
	require.Contains(t, e.String(), "QP 0x12 psn 0x123456 lid 0x1234 gid ::ffff:169.254.77.2 mtu 4096 Ethernet")
}

func TestEndpointRejectsBadBytes(t *testing.T) {
	good, _ := roceRemote(t).MarshalBinary()
	for _, tc := range []struct {
		edit func([]byte) []byte
		want string
	}{
		{func(b []byte) []byte { return b[:31] }, "31 bytes"},
		{func(b []byte) []byte { b[0] = 2; return b }, "version 2"},
		{func(b []byte) []byte { b[1] = 0; return b }, "link layer"},
		{func(b []byte) []byte { b[2] = 6; return b }, "MTU"},
		{func(b []byte) []byte { b[4] = 1; return b }, "QP number"},
		{func(b []byte) []byte { b[4], b[5], b[6], b[7] = 0, 0, 0, 0; return b }, "QP number"},
		{func(b []byte) []byte { b[8] = 1; return b }, "PSN"},
		{func(b []byte) []byte { b[15] = 1; return b }, "reserved"},
	} {
		var e Endpoint
		err := e.UnmarshalBinary(tc.edit(append([]byte(nil), good...)))
		require.ErrorContains(t, err, tc.want)
		require.Equal(t, Endpoint{}, e, "a failed unmarshal leaves the endpoint alone")
	}
}

func FuzzEndpoint(f *testing.F) {
	good, _ := Endpoint{QPN: 1, MTU: MTU1024, LinkLayer: LinkEthernet}.MarshalBinary()
	f.Add(good)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var e Endpoint
		if e.UnmarshalBinary(b) != nil {
			return
		}
		again, err := e.MarshalBinary()
		require.NoError(t, err)
		require.Equal(t, b, again)
	})
}
