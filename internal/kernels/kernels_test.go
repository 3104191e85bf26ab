package kernels

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gccl/gccl/internal/reduce"
)

var allDTypes = []reduce.DType{
	reduce.Int8, reduce.Uint8, reduce.Int32, reduce.Uint32, reduce.Int64, reduce.Uint64,
	reduce.Float16, reduce.BFloat16, reduce.Float32, reduce.Float64,
	reduce.Float8E4M3, reduce.Float8E5M2,
}

var allOps = []Op{OpSum, OpProd, OpMin, OpMax, OpPreMulSum, OpSumDiv}

func TestReduceArgsLayout(t *testing.T) {
	var a ReduceArgs
	if got := unsafe.Sizeof(a); got != 152 {
		t.Errorf("Sizeof(ReduceArgs) = %d, want 152", got)
	}
	offsets := []struct {
		name      string
		got, want uintptr
	}{
		{"Count", unsafe.Offsetof(a.Count), 0},
		{"In", unsafe.Offsetof(a.In), 8},
		{"Out", unsafe.Offsetof(a.Out), 72},
		{"NIn", unsafe.Offsetof(a.NIn), 136},
		{"NOut", unsafe.Offsetof(a.NOut), 140},
		{"Scalar", unsafe.Offsetof(a.Scalar), 144},
	}
	for _, o := range offsets {
		if o.got != o.want {
			t.Errorf("Offsetof(ReduceArgs.%s) = %d, want %d", o.name, o.got, o.want)
		}
	}
}

func TestReduceEntry(t *testing.T) {
	want := map[string]bool{}
	for _, dt := range allDTypes {
		for _, op := range allOps {
			name, err := ReduceEntry(dt, op)
			if err != nil {
				t.Fatalf("ReduceEntry(%v, %v): %v", dt, op, err)
			}
			if want[name] {
				t.Errorf("duplicate entry name %s", name)
			}
			want[name] = true
		}
	}
	if name, _ := ReduceEntry(reduce.BFloat16, OpPreMulSum); name != "gccl_reduce_bfloat16_premulsum" {
		t.Errorf("ReduceEntry(BFloat16, OpPreMulSum) = %q", name)
	}
	if name, _ := ReduceEntry(reduce.Float8E4M3, OpSumDiv); name != "gccl_reduce_float8e4m3_sumdiv" {
		t.Errorf("ReduceEntry(Float8E4M3, OpSumDiv) = %q", name)
	}
	for _, c := range []struct {
		dt reduce.DType
		op Op
	}{{0, OpSum}, {reduce.Float8E5M2 + 1, OpSum}, {reduce.Float32, 0}, {reduce.Float32, OpSumDiv + 1}} {
		if name, err := ReduceEntry(c.dt, c.op); err == nil {
			t.Errorf("ReduceEntry(%v, %v) = %q, want an error", c.dt, c.op, name)
		}
	}
	if s := Op(0).String(); s != "Op(0)" {
		t.Errorf("Op(0).String() = %q", s)
	}
}

var (
	entryRE  = regexp.MustCompile(`(?m)^\.visible \.entry (\w+)\(\s*\n\s*\.param \.align 8 \.b8 (\w+)\[(\d+)\]\s*\n\s*\)`)
	targetRE = regexp.MustCompile(`(?m)^\.target (sm_\d+)\s*$`)
	// A floating-point mad (integer mads, mad.lo, round nothing).
	floatMadRE = regexp.MustCompile(`\tmad\.(rn|rz|rm|rp|f16|bf16|f32|f64|ftz|sat)`)
	// Subnormals flushed (.ftz) or an approximate operation (.approx).
	inexactFloatRE = regexp.MustCompile(`\.(ftz|approx)\b[.\w]*`)
)

// parsed returns the parsed embedded PTX.
func parsed(t *testing.T) *embeddedPTX {
	t.Helper()
	p, err := parsedPTX()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// archPTX returns the embedded PTX of arch with every kernel: the modules
// PTX returns, together.
func archPTX(t *testing.T, arch string) []byte {
	t.Helper()
	p := parsed(t)
	for _, a := range p.archs {
		if a.name == arch {
			return p.module(a, strings.Join(p.kernels[:], ""))
		}
	}
	t.Fatalf("no embedded PTX for %s", arch)
	return nil
}

// TestPTXEntries checks every module PTX returns, for every embedded
// architecture and type: it targets that architecture, it defines exactly
// the type's 6 entries, each with one 152-byte parameter, and its floating
// point rounds as the host's does (no contraction, no flushing of
// subnormals, no approximate operation). Together the modules hold all of
// ptx/reduce.ptx.
func TestPTXEntries(t *testing.T) {
	archs := Architectures()
	if len(archs) == 0 || archs[0] != "sm_70" {
		t.Fatalf("Architectures() = %v, want sm_70 first", archs)
	}
	p := parsed(t)
	kernelBytes := 0
	for _, text := range p.kernels {
		kernelBytes += len(text)
	}
	header := len(".version " + p.archs[0].version + "\n.target " + p.archs[0].name + "\n")
	if n := len(p.head) + header + len(p.preamble) + kernelBytes; n != len(ptxSource) {
		t.Errorf("the modules hold %d bytes of ptx/reduce.ptx's %d", n, len(ptxSource))
	}
	for _, a := range p.archs {
		for _, dt := range allDTypes {
			arch, ptx, err := PTX(a.cc/10, a.cc%10, dt)
			if err != nil || arch != a.name {
				t.Fatalf("PTX(%d, %d, %v) = %s, %v; want %s", a.cc/10, a.cc%10, dt, arch, err, a.name)
			}
			checkModule(t, arch, dt, string(ptx))
		}
	}
}

func checkModule(t *testing.T, arch string, dt reduce.DType, text string) {
	t.Helper()
	where := arch + " " + dt.String()
	targets := targetRE.FindAllStringSubmatch(text, -1)
	if len(targets) != 1 || targets[0][1] != arch {
		t.Errorf("%s: .target lines %v, want one naming %s", where, targets, arch)
	}
	entries := map[string]bool{}
	for _, m := range entryRE.FindAllStringSubmatch(text, -1) {
		name, param, size := m[1], m[2], m[3]
		entries[name] = true
		if param != name+"_param_0" {
			t.Errorf("%s: entry %s has parameter %s", where, name, param)
		}
		if size != fmt.Sprint(unsafe.Sizeof(ReduceArgs{})) {
			t.Errorf("%s: entry %s takes %s bytes, ReduceArgs is %d", where, name, size, unsafe.Sizeof(ReduceArgs{}))
		}
	}
	if n := strings.Count(text, ".entry "); n != len(entries) {
		t.Errorf("%s: %d .entry lines, %d parsed", where, n, len(entries))
	}
	for _, op := range allOps {
		name, _ := ReduceEntry(dt, op)
		if !entries[name] {
			t.Errorf("%s: no .visible .entry %s", where, name)
		}
		delete(entries, name)
	}
	for name := range entries {
		t.Errorf("%s: unexpected entry %s", where, name)
	}
	if strings.Contains(text, "\tfma.") || floatMadRE.MatchString(text) {
		t.Errorf("%s: has fused multiply-adds; build.sh turns contraction off to round like the host", where)
	}
	// The host keeps subnormals and divides exactly; so must the GPU.
	if m := inexactFloatRE.FindString(text); m != "" {
		t.Errorf("%s: has %q (flushes subnormals to zero or rounds approximately), unlike the host", where, m)
	}
	if strings.Contains(text, ".local") {
		t.Errorf("%s: uses local memory (a register array spilled)", where)
	}
}

// TestParsePTXRefuses: embedded PTX that is not as build.sh writes it
// is an error, not a wrong module.
func TestParsePTXRefuses(t *testing.T) {
	entry := func(name string) string {
		return "\t// .globl\t" + name + "\n.visible .entry " + name + "(\n)\n{\n}\n"
	}
	var all strings.Builder
	for _, dt := range allDTypes {
		for _, op := range allOps {
			name, _ := ReduceEntry(dt, op)
			all.WriteString(entry(name))
		}
	}
	good := "// c\n.version 6.0\n.target sm_70\n.address_size 64\n\n" + all.String()
	if _, err := parsePTX(good, "sm_70 6.0\nsm_90 7.8\n"); err != nil {
		t.Fatalf("a well-formed source: %v", err)
	}
	cases := []struct{ why, source, targets string }{
		{"no targets", good, ""},
		{"a target without version", good, "sm_70\n"},
		{"not an sm_ name", good, "compute_70 6.0\n"},
		{"targets out of order", good, "sm_90 7.8\nsm_70 6.0\n"},
		{"the source is not the first target's", good, "sm_75 6.3\n"},
		{"two .target lines", good + ".target sm_80\n", "sm_70 6.0\n"},
		{"no kernels", "// c\n.version 6.0\n.target sm_70\n", "sm_70 6.0\n"},
		{"a kernel missing", strings.Replace(good, entry("gccl_reduce_int8_sum"), "", 1), "sm_70 6.0\n"},
		{"an unknown kernel", good + entry("gccl_reduce_int8_xor"), "sm_70 6.0\n"},
		{"a kernel's text with two entries", good + ".visible .entry gccl_reduce_int8_sum(\n)\n", "sm_70 6.0\n"},
		{"a .globl comment naming nothing", good + "\t// .globl\t", "sm_70 6.0\n"},
	}
	for _, c := range cases {
		if _, err := parsePTX(c.source, c.targets); err == nil {
			t.Errorf("%s: parsed", c.why)
		}
	}
}

func TestPTXSelection(t *testing.T) {
	cases := []struct {
		major, minor int
		want         string
	}{
		{7, 0, "sm_70"}, {7, 2, "sm_70"}, {7, 5, "sm_75"}, {8, 0, "sm_80"}, {8, 6, "sm_86"},
		{8, 9, "sm_89"}, {9, 0, "sm_90"}, {10, 0, "sm_90"}, {12, 0, "sm_90"},
	}
	if got, want := strings.Join(Architectures(), " "), "sm_70 sm_75 sm_80 sm_86 sm_89 sm_90"; got != want {
		t.Fatalf("embedded PTX for %s, want %s", got, want)
	}
	for _, c := range cases {
		want := c.want
		arch, ptx, err := PTX(c.major, c.minor, reduce.BFloat16)
		if err != nil {
			t.Errorf("PTX(%d, %d): %v", c.major, c.minor, err)
			continue
		}
		if arch != want {
			t.Errorf("PTX(%d, %d) = %s, want %s", c.major, c.minor, arch, want)
		}
		if !bytes.Contains(ptx, []byte("\n.target "+arch+"\n")) {
			t.Errorf("PTX(%d, %d): the PTX does not target %s", c.major, c.minor, arch)
		}
	}
	for _, c := range [][2]int{{6, 1}, {5, 0}, {0, 0}} {
		if arch, _, err := PTX(c[0], c[1], reduce.Float32); !errors.Is(err, ErrUnsupportedDevice) {
			t.Errorf("PTX(%d, %d) = %q, %v; want ErrUnsupportedDevice", c[0], c[1], arch, err)
		} else if !strings.Contains(err.Error(), "sm_70") {
			t.Errorf("PTX(%d, %d): error %q does not name sm_70", c[0], c[1], err)
		}
	}
	if _, _, err := PTX(8, 10, reduce.Float32); err == nil {
		t.Error("PTX(8, 10) succeeded")
	}
	if _, _, err := PTX(9, 0, reduce.DType(0)); err == nil {
		t.Error("PTX of DType(0) succeeded")
	}
}

func TestLaunchShape(t *testing.T) {
	cases := []struct {
		count int
		dt    reduce.DType
		sms   int
		grid  uint32
	}{
		{0, reduce.Float32, 108, 1},
		{1, reduce.Float32, 108, 1},
		{2048, reduce.Float32, 108, 1},    // 512 vectors of 4
		{2049, reduce.Float32, 108, 2},    // one more vector
		{8192, reduce.Float8E4M3, 108, 1}, // 512 vectors of 16
		{1 << 30, reduce.Float32, 108, 432},
		{1 << 30, reduce.Float64, 0, 4},
		{1 << 20, reduce.DType(0), 2, 8},
		{-5, reduce.Int8, 1, 1},
	}
	for _, c := range cases {
		grid, block := LaunchShape(c.count, c.dt, c.sms)
		if grid != c.grid || block != BlockSize {
			t.Errorf("LaunchShape(%d, %v, %d) = %d, %d; want %d, %d", c.count, c.dt, c.sms, grid, block, c.grid, BlockSize)
		}
	}
}

// TestPTXUpToDate rebuilds the lowest and the highest architecture with
// the compiler that produced the committed PTX, when it is available, and
// compares ptx/reduce.ptx and the two lines of ptx/targets; build.sh fails
// if the two architectures' PTX differ in more than .version and .target.
// (The four between would take build.sh 30 more seconds.)
func TestPTXUpToDate(t *testing.T) {
	t.Parallel()
	first, _, _ := strings.Cut(ptxSource, "\n")
	const prefix = "// gccl: generated by internal/kernels/build.sh from reduce.cu by "
	version, ok := strings.CutPrefix(first, prefix)
	if !ok {
		t.Fatalf("ptx/reduce.ptx starts with %q, not build.sh's header", first)
	}
	version = strings.TrimSuffix(version, "; do not edit.")
	if !strings.Contains(version, "clang") {
		t.Skipf("the committed PTX comes from %q, not clang; rebuild it with build.sh where that compiler is", version)
	}
	if _, err := exec.LookPath("nvcc"); err == nil {
		t.Skip("nvcc is on PATH, so build.sh would use it instead of clang")
	}
	name := os.Getenv("CLANG") // as build.sh chooses
	if name == "" {
		name = "clang-19"
	}
	clang, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not on PATH; cannot check that ptx/ is up to date", name)
	}
	out, err := exec.Command(clang, "--version").Output()
	if err != nil {
		t.Skipf("clang --version: %v", err)
	}
	if have, _, _ := strings.Cut(string(out), "\n"); strings.TrimSpace(have) != version {
		t.Skipf("the committed PTX comes from %q, this clang is %q", version, strings.TrimSpace(have))
	}
	dir := t.TempDir()
	archs := parsed(t).archs
	lo, hi := archs[0], archs[len(archs)-1]
	cmd := exec.Command("sh", "build.sh", "-o", dir, lo.name, hi.name)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build.sh: %v\n%s", err, out)
	}
	got, err := os.ReadFile(filepath.Join(dir, "reduce.ptx"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != ptxSource {
		t.Error("ptx/reduce.ptx is out of date with reduce.cu: run internal/kernels/build.sh and commit ptx/")
	}
	targets, err := os.ReadFile(filepath.Join(dir, "targets"))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s %s\n%s %s\n", lo.name, lo.version, hi.name, hi.version); string(targets) != want {
		t.Errorf("build.sh wrote targets\n%s\nwhere ptx/targets says\n%s", targets, want)
	}
}

// TestHostEmulation compiles testdata/check.c (which includes hostemu.c and
// so reduce.cu) with gcc and runs it: it checks the C conversions bit-exact
// against reduce's Go converters, then every kernel against a reference on
// random data.
func TestHostEmulation(t *testing.T) {
	t.Parallel()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is not on PATH; the host emulation of the kernels is not checked")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "check")
	cmd := exec.Command(gcc, "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-o", bin, "testdata/check.c", "-lm")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %#x", seed)
	conv := filepath.Join(dir, "conv.bin")
	writeConversions(t, conv, seed)
	cmd = exec.Command(bin, conv, fmt.Sprintf("%#x", seed))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("check (seed %#x): %v\n%s", seed, err, out)
	}
	t.Logf("check ran in %v", time.Since(start).Round(time.Millisecond))
	t.Logf("%s", bytes.TrimSpace(out))
}

// writeConversions writes the input of check.c's conversion check: the Go
// widening of every narrow bit pattern, then float32 values with their Go
// narrowings.
func writeConversions(t *testing.T, path string, seed uint64) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var b4 [4]byte
	put32 := func(v uint32) {
		binary.LittleEndian.PutUint32(b4[:], v)
		w.Write(b4[:])
	}
	for h := range 1 << 16 {
		put32(math.Float32bits(reduce.F16ToF32(uint16(h))))
	}
	for h := range 1 << 16 {
		put32(math.Float32bits(reduce.BF16ToF32(uint16(h))))
	}
	for b := range 256 {
		put32(math.Float32bits(reduce.E4M3ToF32(uint8(b))))
	}
	for b := range 256 {
		put32(math.Float32bits(reduce.E5M2ToF32(uint8(b))))
	}

	var xs []uint32
	// Every narrow value and its float32 neighbours, the midpoints between
	// neighbouring narrow values and theirs (the ties).
	near := func(x uint32) { xs = append(xs, x, x-1, x+1) }
	for h := range 1 << 16 {
		near(math.Float32bits(reduce.F16ToF32(uint16(h))))
		near(uint32(h)<<16 | 0x8000)
		if h&0x7c00 != 0 && h&0x7c00 != 0x7c00 {
			near(math.Float32bits(reduce.F16ToF32(uint16(h))) | 0x1000)
		}
	}
	for b := range 256 {
		for _, x := range []uint32{math.Float32bits(reduce.E4M3ToF32(uint8(b))), math.Float32bits(reduce.E5M2ToF32(uint8(b)))} {
			near(x)
			near(x | 0x80000)
			near(x | 0x100000)
		}
	}
	xs = append(xs, 0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffbfffff, 0x7f7fffff, 1,
		math.Float32bits(464), math.Float32bits(448), math.Float32bits(65520), math.Float32bits(61440))
	r := rand.New(rand.NewPCG(seed, 0x6b65726e656c73))
	for range 1 << 20 {
		xs = append(xs, r.Uint32())
	}
	// Values across the narrow formats' ranges, many of them exact ties or
	// one off a tie at some bit position.
	for range 1 << 21 {
		exp := uint32(127-32) + r.Uint32N(56)
		mant := r.Uint32() & 0x7fffff
		if r.Uint32N(4) != 0 {
			j := 1 + r.Uint32N(23)
			mant = mant&^(1<<j-1) | 1<<(j-1)
			mant += uint32(int32(r.Uint32N(3)) - 1)
			mant &= 0x7fffff
		}
		xs = append(xs, r.Uint32()&0x80000000|exp<<23|mant)
	}
	put32(uint32(len(xs)))
	var rec [12]byte
	for _, x := range xs {
		v := math.Float32frombits(x)
		binary.LittleEndian.PutUint32(rec[0:], x)
		binary.LittleEndian.PutUint16(rec[4:], reduce.F32ToF16(v))
		binary.LittleEndian.PutUint16(rec[6:], reduce.F32ToBF16(v))
		rec[8] = reduce.F32ToE4M3(v)
		rec[9] = reduce.F32ToE5M2(v)
		w.Write(rec[:])
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// FuzzParsePTX: no source or target list makes parsePTX panic, and what it
// accepts has every kernel (go test runs the seeds; go test -fuzz
// FuzzParsePTX ./internal/kernels searches further).
func FuzzParsePTX(f *testing.F) {
	f.Add(ptxSource[:4096], ptxTargets)
	f.Add("\n.version 6.0\n.target sm_70\n\t// .globl\t", "sm_70 6.0")
	f.Add("\n.version 6.0\n.target sm_70\n\t// .globl\tx\n.visible .entry x(", "sm_70 6.0\nsm_90 7.8")
	f.Fuzz(func(t *testing.T, source, targets string) {
		p, err := parsePTX(source, targets)
		if err != nil {
			return
		}
		for _, dt := range allDTypes {
			if n := strings.Count(p.kernels[dt], ".entry "); n != len(allOps) {
				t.Fatalf("accepted, with %d entries for %v", n, dt)
			}
		}
	})
}
