//go:build 386 || amd64 || arm64 || loong64 || ppc64 || ppc64le || s390x || wasm

package reduce

// mustAlign is false where the hardware loads misaligned words itself, so
// kernels may view any byte buffer as a typed slice.
const mustAlign = false
