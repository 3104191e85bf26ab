// Package kernels holds gccl's GPU reduction kernels as embedded PTX and
// machine code (cubin.go), and
// what a launcher needs to use them: the entry point of each (element type,
// operator), the layout of their one parameter, and a launch shape. It has
// no cgo and no CUDA dependency; internal/cuda loads the machine code or
// the PTX into a module and launches the entries.
//
// # Kernels
//
// reduce.cu defines one kernel per (reduce.DType, Op), named
// gccl_reduce_<dtype>_<op> (ReduceEntry), for example
// gccl_reduce_bfloat16_sum. Each takes one parameter by value, a ReduceArgs
// (152 bytes, the C struct gccl_reduce_args of gccl_kernels.h), and computes
// for every element i < Count
//
//	acc = In[0][i] op In[1][i] op ... op In[NIn-1][i]
//	Out[0][i] = ... = Out[NOut-1][i] = acc
//
// with 1 <= NIn <= MaxInputs and 1 <= NOut <= MaxOutputs. An output may be
// exactly the same memory as an input (in place). The arithmetic follows
// internal/reduce: integers wrap; float32 and float64 compute in their own
// precision; float16, bfloat16 and the two fp8 formats widen to float32
// (bit-exactly as reduce's converters), accumulate all NIn inputs in float32
// and round back to nearest-even once, so a result can differ in the last
// bit from the host ring, which rounds after every step; Max of two zeros of
// different sign is +0 and Min is -0; NaN results are unspecified.
// OpPreMulSum sums x*Scalar (for integer types Scalar is truncated to an
// integer first). OpSumDiv is an integer average: the wrapped sum divided by
// int64(Scalar), truncating (Scalar must be at least 1); for float types it
// is the sum times 1/Scalar in the compute type, which exists for
// completeness and which gccl's collectives do not use for floats. Scalar
// must be finite (and in int64 range for integer types). Each thread walks
// the elements with a
// grid-stride loop, in 16-byte vectors when every pointer is 16-byte
// aligned.
//
// # PTX
//
// build.sh compiles reduce.cu to PTX for sm_70, sm_75, sm_80, sm_86, sm_89
// and sm_90 (run it after editing reduce.cu or gccl_kernels.h, and commit
// ptx/), by nvcc when it is on PATH and otherwise by clang 19's NVPTX
// backend with no CUDA headers or libraries. The six differ only in their
// .version and .target lines, so one copy is embedded: ptx/reduce.ptx is
// the sm_70 PTX (its first line names its compiler), and ptx/targets lists
// each architecture with its PTX ISA version (sm_90: 7.8, which needs a
// CUDA 11.8 or newer driver). PTX rebuilds the file of the highest
// architecture a device can run, and the driver JIT-compiles it for the
// device, so GPUs newer than Hopper run the sm_90 code. FMA contraction is
// off in every build, so that a product is rounded before it is added, as
// on the host.
//
// The same reduce.cu compiles as C: hostemu.c runs it on the CPU (serially,
// block by block and thread by thread) for the fake CUDA driver of the
// tests, and the tests check it there against a reference. The PTX itself
// is checked for structure (entries, targets, parameter size, rounding) and
// assembled by NVIDIA's ptxas for every architecture, whose machine code the
// tests read with nvdisasm (TestPTXAssembles). It ran on an H100 on
// 2026-11-23 (docs/HARDWARE.md).
package kernels

import (
	_ "embed" // the PTX
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/gccl/gccl/internal/reduce"
)

// ptxSource is the PTX of the lowest architecture in ptxTargets, whose
// lines "sm_XX <PTX ISA version>" list every architecture whose PTX differs
// from it only in its .version and .target lines (build.sh checks that).
var (
	//go:embed ptx/reduce.ptx
	ptxSource string
	//go:embed ptx/targets
	ptxTargets string
)

// MaxInputs and MaxOutputs bound ReduceArgs.NIn and ReduceArgs.NOut.
const (
	MaxInputs  = 8
	MaxOutputs = 8
)

// ReduceArgs is the single by-value parameter of every reduction kernel,
// laid out exactly as struct gccl_reduce_args (152 bytes, no padding). In
// and Out hold device addresses; entries past NIn and NOut are ignored.
type ReduceArgs struct {
	Count  uint64             // elements per buffer
	In     [MaxInputs]uint64  // input buffers, reduced in this order
	Out    [MaxOutputs]uint64 // output buffers, each receiving the result
	NIn    int32              // 1..MaxInputs
	NOut   int32              // 1..MaxOutputs
	Scalar float64            // multiplier of OpPreMulSum, divisor of OpSumDiv
}

// Op is a GPU reduction operator.
type Op uint8

// The operators; see the package documentation for their semantics.
const (
	OpSum Op = iota + 1
	OpProd
	OpMin
	OpMax
	OpPreMulSum // sum of x*Scalar
	OpSumDiv    // sum / int64(Scalar), for the integer average
)

var opNames = [...]string{
	OpSum: "sum", OpProd: "prod", OpMin: "min", OpMax: "max",
	OpPreMulSum: "premulsum", OpSumDiv: "sumdiv",
}

// Valid reports whether o is one of the defined operators.
func (o Op) Valid() bool { return o >= OpSum && o <= OpSumDiv }

func (o Op) String() string {
	if !o.Valid() {
		return "Op(" + strconv.Itoa(int(o)) + ")"
	}
	return opNames[o]
}

// ReduceEntry returns the name of the kernel entry point reducing dt with
// op, such as "gccl_reduce_float32_sum".
func ReduceEntry(dt reduce.DType, op Op) (string, error) {
	if !dt.Valid() {
		return "", fmt.Errorf("kernels: invalid data type %v", dt)
	}
	if !op.Valid() {
		return "", fmt.Errorf("kernels: invalid operator %v", op)
	}
	return "gccl_reduce_" + dt.String() + "_" + op.String(), nil
}

// ptxArch is one architecture of the embedded PTX.
type ptxArch struct {
	cc      int    // compute capability as major*10+minor
	name    string // "sm_86"
	version string // its PTX ISA version, "7.1"
}

// embeddedPTX is ptxSource taken apart: head (up to its .version line) and
// preamble (after its .target line, up to the first kernel) are what every
// module starts with, and kernels[dt] is the text of dt's kernels, one
// per Op. Each kernel's text runs from the "// .globl NAME" comment before
// its .entry to the next one.
type embeddedPTX struct {
	archs    []ptxArch
	head     string
	preamble string
	kernels  [maxDType + 1]string
}

const maxDType = reduce.Float8E5M2

// parsedPTX parses the embedded PTX at its first use, not at every
// program's start.
var parsedPTX = sync.OnceValues(func() (*embeddedPTX, error) { return parsePTX(ptxSource, ptxTargets) })

func parsePTX(source, targets string) (*embeddedPTX, error) {
	p := &embeddedPTX{}
	for _, line := range strings.Split(strings.TrimSpace(targets), "\n") {
		name, version, ok := strings.Cut(line, " ")
		digits, isSM := strings.CutPrefix(name, "sm_")
		cc, err := strconv.Atoi(digits)
		if !ok || !isSM || err != nil || cc <= 0 || version == "" || len(p.archs) > 0 && cc <= p.archs[len(p.archs)-1].cc {
			return nil, fmt.Errorf("kernels: ptx/targets: bad line %q", line)
		}
		p.archs = append(p.archs, ptxArch{cc, name, version})
	}
	if len(p.archs) == 0 {
		return nil, errors.New("kernels: ptx/targets lists no architecture")
	}
	header := "\n.version " + p.archs[0].version + "\n.target " + p.archs[0].name + "\n"
	i := strings.Index(source, header)
	if i < 0 || strings.Count(source, "\n.version ") != 1 || strings.Count(source, "\n.target ") != 1 {
		return nil, fmt.Errorf("kernels: ptx/reduce.ptx does not have the one .version and .target of %s", p.archs[0].name)
	}
	p.head, source = source[:i+1], source[i+len(header):]
	const globl = "\t// .globl\t"
	first := strings.Index(source, globl)
	if first < 0 {
		return nil, errors.New("kernels: ptx/reduce.ptx has no kernel")
	}
	p.preamble, source = source[:first], source[first:]
	texts := map[string]string{}
	for source != "" {
		next := strings.Index(source[len(globl):], globl)
		text := source
		if next >= 0 {
			text, source = source[:len(globl)+next], source[len(globl)+next:]
		} else {
			source = ""
		}
		line, _, _ := strings.Cut(text[len(globl):], "\n")
		name := "(none)"
		if f := strings.Fields(line); len(f) > 0 {
			name = f[0]
		}
		if strings.Count(text, ".entry ") != 1 || !strings.Contains(text, "\n.visible .entry "+name+"(") {
			return nil, fmt.Errorf("kernels: ptx/reduce.ptx: the text of %s is not one entry of that name", name)
		}
		texts[name] = text
	}
	for dt := reduce.Int8; dt <= maxDType; dt++ {
		for op := OpSum; op <= OpSumDiv; op++ {
			name, _ := ReduceEntry(dt, op)
			text, ok := texts[name]
			if !ok {
				return nil, fmt.Errorf("kernels: ptx/reduce.ptx has no kernel %s", name)
			}
			p.kernels[dt] += text
			delete(texts, name)
		}
	}
	if len(texts) != 0 {
		return nil, fmt.Errorf("kernels: ptx/reduce.ptx has kernels of no known type and operator (%d)", len(texts))
	}
	return p, nil
}

// ErrUnsupportedDevice is returned (wrapped) by PTX for a device older than
// every embedded architecture.
var ErrUnsupportedDevice = errors.New("kernels: device too old for gccl's GPU kernels")

// PTX returns the PTX of dt's kernels, one per Op, for the highest embedded
// architecture that a device of compute capability major.minor can run, and
// that architecture's name ("sm_86"). The driver JIT-compiles a module when
// it loads it, and one type's kernels are a twelfth of the work: NVIDIA's
// ptxas 11.8 takes 0.26 s for float32's on sm_90 and 4.2 s for all 72, on
// the 2-vCPU CI machine (BenchmarkPTXAssemble). ptx is a fresh copy and is not
// NUL-terminated: cuModuleLoadData wants PTX text with a terminating NUL,
// so append one before loading it.
func PTX(major, minor int, dt reduce.DType) (arch string, ptx []byte, err error) {
	if major < 0 || minor < 0 || minor > 9 {
		return "", nil, fmt.Errorf("kernels: invalid compute capability %d.%d", major, minor)
	}
	if !dt.Valid() {
		return "", nil, fmt.Errorf("kernels: invalid data type %v", dt)
	}
	p, err := parsedPTX()
	if err != nil {
		return "", nil, err
	}
	cc := major*10 + minor
	for i := len(p.archs) - 1; i >= 0; i-- {
		if a := p.archs[i]; a.cc <= cc {
			return a.name, p.module(a, p.kernels[dt]), nil
		}
	}
	return "", nil, fmt.Errorf("%w: compute capability %d.%d, the oldest supported is %s", ErrUnsupportedDevice, major, minor, p.archs[0].name)
}

// module returns the PTX of kernels for a, as the compiler wrote it but
// for the kernels left out.
func (p *embeddedPTX) module(a ptxArch, kernels string) []byte {
	b := make([]byte, 0, len(p.head)+len(p.preamble)+len(kernels)+64)
	b = append(b, p.head...)
	b = append(b, ".version "+a.version+"\n.target "+a.name+"\n"...)
	b = append(b, p.preamble...)
	return append(b, kernels...)
}

// Architectures lists the embedded PTX architectures, lowest first (none
// if the embedded PTX is malformed, which the tests rule out).
func Architectures() []string {
	p, err := parsedPTX()
	if err != nil {
		return nil
	}
	names := make([]string, len(p.archs))
	for i, a := range p.archs {
		names[i] = a.name
	}
	return names
}

// Launch shape: BlockSize threads per block, at most BlocksPerSM blocks per
// multiprocessor (with 512 threads that is 2048 resident threads, a full
// SM on sm_70 and newer); the grid-stride loop covers the rest.
const (
	BlockSize   = 512
	BlocksPerSM = 4
)

// LaunchShape returns the grid and block sizes for reducing count elements
// of dt on a device with multiProcessors SMs: one thread per 16-byte vector
// of elements, in blocks of BlockSize, at most BlocksPerSM blocks per SM
// and at least one block. A non-positive multiProcessors counts as one.
func LaunchShape(count int, dt reduce.DType, multiProcessors int) (grid, block uint32) {
	size := dt.Size()
	if size == 0 {
		size = 1
	}
	if multiProcessors < 1 {
		multiProcessors = 1
	}
	if count < 0 {
		count = 0
	}
	perThread := uint64(16 / size)
	threads := (uint64(count) + perThread - 1) / perThread
	blocks := (threads + BlockSize - 1) / BlockSize
	limit := uint64(multiProcessors) * BlocksPerSM
	if blocks > limit {
		blocks = limit
	}
	if blocks > 1<<31-1 {
		blocks = 1<<31 - 1
	}
	if blocks < 1 {
		blocks = 1
	}
	return uint32(blocks), BlockSize
}
