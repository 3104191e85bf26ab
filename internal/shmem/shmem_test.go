package shmem

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestJobSegmentNames(t *testing.T) {
	for name, want := range map[string]bool{
		"gccl-7-0": true, "gccl-7-12": true, "gccl-7-3-buf0": true, "gccl-7-3-buf17": true,
		"gccl-7-1-0": false, "gccl-7-x": false, "gccl-7-": false, "gccl-7-3-buf": false, "gccl-70-1": false, "gccl-7-3-bufx": false,
	} {
		require.Equal(t, want, IsJobSegment(name, "7"), "IsJobSegment(%q, 7)", name)
	}
	require.NoError(t, CheckJobID("a.b_c-9"))
	for _, bad := range []string{"-x", "a b", strings.Repeat("a", 200), "", ".x", "../etc"} {
		require.Error(t, CheckJobID(bad), "job ID %q", bad)
	}
	require.Equal(t, "/d/gccl-j-3", MailboxPath("/d", "j", 3))
	require.Equal(t, "/d/gccl-j-3-buf5", RegionPath("/d", "j", 3, 5))
	require.True(t, IsJobSegment("gccl-j-3-buf5", "j") && IsJobSegment("gccl-j-3", "j"))
}
