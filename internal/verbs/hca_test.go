package verbs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHCAFilter(t *testing.T) {
	type port struct {
		dev  string
		port int
	}
	ports := []port{{"mlx5_0", 1}, {"mlx5_0", 2}, {"mlx5_1", 1}, {"mlx5_10", 1}, {"rxe0", 1}}
	for _, tc := range []struct {
		env  string
		want []port
	}{
		{"", ports},
		{"mlx5", []port{{"mlx5_0", 1}, {"mlx5_0", 2}, {"mlx5_1", 1}, {"mlx5_10", 1}}},
		{"mlx5_1", []port{{"mlx5_1", 1}, {"mlx5_10", 1}}}, // a prefix
		{"=mlx5_1", []port{{"mlx5_1", 1}}},
		{"mlx5_0:1,mlx5_1", []port{{"mlx5_0", 1}, {"mlx5_1", 1}, {"mlx5_10", 1}}},
		{"=mlx5_0:2, rxe0", []port{{"mlx5_0", 2}, {"rxe0", 1}}},
		{"^mlx5_0", []port{{"mlx5_1", 1}, {"mlx5_10", 1}, {"rxe0", 1}}},
		{"^mlx5_0:2", []port{{"mlx5_0", 1}, {"mlx5_1", 1}, {"mlx5_10", 1}, {"rxe0", 1}}},
		{"^=mlx5_1", []port{{"mlx5_0", 1}, {"mlx5_0", 2}, {"mlx5_10", 1}, {"rxe0", 1}}},
		{"^mlx5_1", []port{{"mlx5_0", 1}, {"mlx5_0", 2}, {"rxe0", 1}}},
		{"^", ports},
		{"nothing", nil},
		{"=mlx5", nil},
	} {
		f, err := ParseHCAFilter(tc.env)
		require.NoError(t, err, tc.env)
		var got []port
		for _, p := range ports {
			if f.Match(p.dev, p.port) {
				got = append(got, p)
			}
		}
		require.Equal(t, tc.want, got, "GCCL_IB_HCA=%q", tc.env)
	}
}

func TestHCAFilterParse(t *testing.T) {
	f, err := ParseHCAFilter(" ^=mlx5_0:1,,mlx5_1 ")
	require.NoError(t, err)
	require.Equal(t, HCAFilter{Exclude: true, Exact: true, Entries: []HCAEntry{{"mlx5_0", 1}, {"mlx5_1", 0}}}, f)
	require.Equal(t, "^=mlx5_0:1,mlx5_1", f.String())
	for _, bad := range []string{"mlx5_0:", "mlx5_0:x", "mlx5_0:0", ":1", "mlx5_0:256", "=^mlx5_0"} {
		_, err := ParseHCAFilter(bad)
		require.Error(t, err, bad)
	}
}
