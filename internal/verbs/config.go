package verbs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Config is what the environment says about RDMA devices and connections,
// with NCCL's names and meanings (GCCL_ for NCCL_).
type Config struct {
	// Disable (GCCL_IB_DISABLE=1): use no RDMA device at all.
	Disable bool
	// HCA (GCCL_IB_HCA) picks the devices and ports to use.
	HCA HCAFilter
	// GIDIndex (GCCL_IB_GID_INDEX) forces a GID table index; -1 chooses
	// (RoCE v2 with an IPv4 address first).
	GIDIndex int
	// Timeout (GCCL_IB_TIMEOUT, 1-31, default 20) is the ACK timeout
	// exponent: a packet is retransmitted after 4.096 µs × 2^Timeout.
	Timeout uint8
	// RetryCnt (GCCL_IB_RETRY_CNT, 0-7, default 7) is how many times a
	// packet is retransmitted before the work request fails with
	// "transport retry counter exceeded".
	RetryCnt uint8
	// TrafficClass (GCCL_IB_TC, 0-255) and SL (GCCL_IB_SL, 0-15) mark the
	// QPs' packets (RoCE: DSCP/ECN and priority; IB: service level).
	TrafficClass uint8
	SL           uint8
}

// The defaults: NCCL's.
const (
	DefaultTimeout  = 20
	DefaultRetryCnt = 7
	// rnrRetry 7 means "retry forever" when the peer has no receive
	// posted; minRNRTimer 12 is 0.64 ms between those retries.
	rnrRetry    = 7
	minRNRTimer = 12
	hopLimit    = 255
)

// DefaultConfig is the configuration of an empty environment.
func DefaultConfig() Config {
	return Config{GIDIndex: -1, Timeout: DefaultTimeout, RetryCnt: DefaultRetryCnt}
}

// ConfigFromEnv reads the GCCL_IB_* variables. A malformed value is an
// error naming the variable.
func ConfigFromEnv() (Config, error) { return configFrom(os.Getenv) }

// ConfigFrom reads the GCCL_IB_* variables through getenv (a transport's
// Setup.Getenv).
func ConfigFrom(getenv func(string) string) (Config, error) { return configFrom(getenv) }

func configFrom(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	num := func(name string, lo, hi int, dst func(int)) error {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return fmt.Errorf("verbs: %s=%q: want an integer from %d to %d", name, v, lo, hi)
		}
		dst(n)
		return nil
	}
	var disable int
	for _, err := range []error{
		num("GCCL_IB_DISABLE", 0, 1, func(n int) { disable = n }),
		num("GCCL_IB_GID_INDEX", -1, 255, func(n int) { c.GIDIndex = n }),
		num("GCCL_IB_TIMEOUT", 1, 31, func(n int) { c.Timeout = uint8(n) }),
		num("GCCL_IB_RETRY_CNT", 0, 7, func(n int) { c.RetryCnt = uint8(n) }),
		num("GCCL_IB_TC", 0, 255, func(n int) { c.TrafficClass = uint8(n) }),
		num("GCCL_IB_SL", 0, 15, func(n int) { c.SL = uint8(n) }),
	} {
		if err != nil {
			return Config{}, err
		}
	}
	c.Disable = disable == 1
	f, err := ParseHCAFilter(getenv("GCCL_IB_HCA"))
	if err != nil {
		return Config{}, err
	}
	c.HCA = f
	return c, nil
}
