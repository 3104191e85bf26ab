//go:build linux && cgo

package nvlink_test

import "os"

// realGPU: GCCL_TEST_REAL_GPU=1 runs these tests on the installed driver
// instead of the fake one (on a GPU machine).
func realGPU() bool { return os.Getenv("GCCL_TEST_REAL_GPU") == "1" }
