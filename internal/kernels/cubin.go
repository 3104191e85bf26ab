package kernels

import (
	"bytes"
	"compress/gzip"
	"embed"
	"fmt"
	"io"

	"github.com/gccl/gccl/internal/reduce"
)

// Machine code. The driver compiles PTX as it loads it, which takes 5-7 s
// for all twelve types on an H100 with its JIT cache empty
// (docs/PERFORMANCE.md). So beside the PTX, cubin/ holds each type's
// kernels assembled by ptxas (CUDA 11.8, -O3) for the architectures of
// the data-center GPUs, gzipped: sm_XX_TYPE.cubin.gz. Machine code runs on
// its architecture and on later minor versions of the same major one
// (sm_80's on sm_86 and sm_89); other devices (sm_100 and newer) get the
// PTX. TestCubinsMatchPTX rebuilds them from the PTX with ptxas and
// compares (-update rewrites them, after build.sh).
//
//go:embed cubin
var cubins embed.FS

// cubinArchs are the architectures with embedded machine code, newest
// first.
var cubinArchs = []struct {
	major, minor int
	name         string
}{{9, 0, "sm_90"}, {8, 0, "sm_80"}, {7, 0, "sm_70"}}

// cubinArch returns the architecture whose machine code a device of
// compute capability major.minor runs, or "" if none does.
func cubinArch(major, minor int) string {
	for _, a := range cubinArchs {
		if a.major == major && a.minor <= minor {
			return a.name
		}
	}
	return ""
}

// Cubin returns the machine code of dt's kernels for a device of compute
// capability major.minor, and its architecture ("sm_80"); a nil image if
// none is embedded for the device, which then loads the PTX instead.
func Cubin(major, minor int, dt reduce.DType) (arch string, image []byte, err error) {
	if !dt.Valid() {
		return "", nil, fmt.Errorf("kernels: invalid data type %v", dt)
	}
	arch = cubinArch(major, minor)
	if arch == "" {
		return "", nil, nil
	}
	f, err := cubins.Open("cubin/" + cubinName(arch, dt))
	if err != nil {
		return "", nil, fmt.Errorf("kernels: no %s machine code for %v: %w", arch, dt, err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err == nil {
		var b bytes.Buffer
		if _, err = io.Copy(&b, z); err == nil {
			return arch, b.Bytes(), nil
		}
	}
	return "", nil, fmt.Errorf("kernels: %s machine code for %v: %w", arch, dt, err)
}

func cubinName(arch string, dt reduce.DType) string {
	return arch + "_" + dt.String() + ".cubin.gz"
}
