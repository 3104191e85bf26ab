package transport

import "fmt"

// EnvRuntimeConnect, as NCCL_RUNTIME_CONNECT: 1 (the default) connects a
// pair at its first use, 0 connects every pair at Init, so that an
// unreachable peer fails Init rather than the first collective that needs
// it. The transports that connect pairs (TCP, RDMA) read it.
const EnvRuntimeConnect = "GCCL_RUNTIME_CONNECT"

// EagerConnect reports whether getenv asks for every pair to connect at
// Init (GCCL_RUNTIME_CONNECT=0), and refuses a value it does not know.
func EagerConnect(getenv func(string) string) (bool, error) {
	switch v := getenv(EnvRuntimeConnect); v {
	case "", "1":
		return false, nil
	case "0":
		return true, nil
	default:
		return false, fmt.Errorf("%s=%q: want 1 (connect each pair at its first use, the default) or 0 (every pair at Init)", EnvRuntimeConnect, v)
	}
}
