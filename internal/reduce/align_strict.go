//go:build !(386 || amd64 || arm64 || loong64 || ppc64 || ppc64le || s390x || wasm)

package reduce

// mustAlign is true where misaligned word loads may fault (or trap to slow
// emulation); generic kernels then copy misaligned buffers through aligned
// stack memory.
const mustAlign = true
