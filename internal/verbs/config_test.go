package verbs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConfigFromEnv(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	c, err := configFrom(env(nil))
	require.NoError(t, err)
	require.Equal(t, DefaultConfig(), c)
	require.Equal(t, Config{GIDIndex: -1, Timeout: 20, RetryCnt: 7}, c)

	c, err = configFrom(env(map[string]string{
		"GCCL_IB_DISABLE": "1", "GCCL_IB_HCA": "=mlx5_0:1", "GCCL_IB_GID_INDEX": "3", "GCCL_IB_TIMEOUT": "22",
		"GCCL_IB_RETRY_CNT": "5", "GCCL_IB_TC": "106", "GCCL_IB_SL": "2",
	}))
	require.NoError(t, err)
	require.Equal(t, Config{Disable: true, HCA: HCAFilter{Exact: true, Entries: []HCAEntry{{"mlx5_0", 1}}},
		GIDIndex: 3, Timeout: 22, RetryCnt: 5, TrafficClass: 106, SL: 2}, c)

	for k, v := range map[string]string{
		"GCCL_IB_DISABLE": "yes", "GCCL_IB_TIMEOUT": "0", "GCCL_IB_RETRY_CNT": "8", "GCCL_IB_GID_INDEX": "-2",
		"GCCL_IB_SL": "16", "GCCL_IB_HCA": "mlx5_0:one",
	} {
		_, err := configFrom(env(map[string]string{k: v}))
		require.ErrorContains(t, err, k, "%s=%s", k, v)
	}
}
