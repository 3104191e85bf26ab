package kernels

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// ptxas returns NVIDIA's PTX assembler (GCCL_PTXAS, else ptxas on PATH), or
// skips t. CI fetches it from Debian's nvidia-cuda-toolkit (.ci/nvidia-tools.sh);
// no GPU is needed to run it.
func ptxas(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("GCCL_PTXAS"); p != "" {
		return p
	}
	p, err := exec.LookPath("ptxas")
	if err != nil {
		t.Skip("ptxas not found (set GCCL_PTXAS; .ci/nvidia-tools.sh fetches one)")
	}
	return p
}

var (
	ptxasEntryRE = regexp.MustCompile(`Compiling entry function '(\w+)' for '(sm_\d+)'`)
	ptxasSpillRE = regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
	ptxasRegsRE  = regexp.MustCompile(`Used (\d+) registers`)
)

// TestPTXAssembles assembles the PTX of every embedded architecture
// with ptxas, as the driver's JIT compiler will on a GPU: it must accept
// every kernel, and no kernel may use a stack frame or spill registers to
// local memory (the kernels are meant to make one pass over memory).
// It logs the register counts, which bound how many threads an SM holds.
func TestPTXAssembles(t *testing.T) {
	if testing.Short() {
		t.Skip("assembling every architecture takes tens of seconds")
	}
	bin := ptxas(t)
	want := len(allDTypes) * len(allOps)
	for _, arch := range Architectures() {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src := filepath.Join(dir, arch+".ptx")
			if err := os.WriteFile(src, archPTX(t, arch), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "-arch="+arch, "-O3", "-v", "-o", filepath.Join(dir, arch+".cubin"), src).CombinedOutput()
			if err != nil {
				t.Fatalf("ptxas -arch=%s: %v\n%s", arch, err, out)
			}
			entries := ptxasEntryRE.FindAllSubmatch(out, -1)
			for _, m := range entries {
				if string(m[2]) != arch {
					t.Errorf("ptxas compiled %s for %s, want %s", m[1], m[2], arch)
				}
			}
			spills := ptxasSpillRE.FindAllSubmatch(out, -1)
			regs := ptxasRegsRE.FindAllSubmatch(out, -1)
			if len(entries) != want || len(spills) != want || len(regs) != want {
				t.Fatalf("ptxas reported %d entries, %d frames and %d register counts, want %d of each:\n%s",
					len(entries), len(spills), len(regs), want, out)
			}
			lo, hi := 1<<30, 0
			for i, m := range spills {
				if string(m[1]) != "0" || string(m[2]) != "0" || string(m[3]) != "0" {
					t.Errorf("%s: %s", entries[i][1], m[0])
				}
				r, _ := strconv.Atoi(string(regs[i][1]))
				lo, hi = min(lo, r), max(hi, r)
			}
			t.Logf("%s: %d kernels, %d-%d registers per thread", arch, want, lo, hi)
			checkVectorized(t, filepath.Join(filepath.Dir(bin), "nvdisasm"), filepath.Join(dir, arch+".cubin"))
		})
	}
}

var (
	sassFunctionRE = regexp.MustCompile(`(?m)^\.text\.(\w+):`)
	sassLoad128RE  = regexp.MustCompile(`LDG\.E[.A-Z0-9]*\.128`)
	sassStore128RE = regexp.MustCompile(`STG\.E[.A-Z0-9]*\.128`)
)

// checkVectorized disassembles cubin with nvdisasm (beside ptxas, else on
// PATH; the check is skipped without one) and requires every kernel's
// machine code to load and store 16 bytes at a time, for every element
// type. (Left to itself clang stored the vectors of 1-byte types as four
// 4-byte words; reduce.cu's gccl_store16 is why it no longer does.)
func checkVectorized(t *testing.T, nvdisasm, cubin string) {
	t.Helper()
	if _, err := os.Stat(nvdisasm); err != nil {
		if nvdisasm, err = exec.LookPath("nvdisasm"); err != nil {
			t.Log("nvdisasm not found: the machine code's loads and stores were not checked")
			return
		}
	}
	out, err := exec.Command(nvdisasm, cubin).CombinedOutput()
	if err != nil {
		t.Fatalf("nvdisasm: %v\n%s", err, out)
	}
	code := map[string][]byte{}
	fns := sassFunctionRE.FindAllSubmatchIndex(out, -1)
	for i, m := range fns {
		end := len(out)
		if i+1 < len(fns) {
			end = fns[i+1][0]
		}
		code[string(out[m[2]:m[3]])] = out[m[1]:end]
	}
	for _, dt := range allDTypes {
		for _, op := range allOps {
			name, _ := ReduceEntry(dt, op)
			sass, ok := code[name]
			switch {
			case !ok:
				t.Errorf("nvdisasm shows no function %s", name)
			case !sassLoad128RE.Match(sass):
				t.Errorf("%s: no 16-byte load (LDG.E.128) in its machine code", name)
			case !sassStore128RE.Match(sass):
				t.Errorf("%s: no 16-byte store (STG.E.128) in its machine code", name)
			}
		}
	}
}

// BenchmarkPTXAssemble times NVIDIA's ptxas assembling, for sm_90, the
// module PTX returns for each type, and all 72 kernels at once: the work the
// driver's JIT compiler does when it loads them (nvlink loads one type's
// module at a time). Without ptxas it skips.
func BenchmarkPTXAssemble(b *testing.B) {
	bin := ptxas(b)
	run := func(b *testing.B, ptx []byte) {
		dir := b.TempDir()
		src := filepath.Join(dir, "m.ptx")
		if err := os.WriteFile(src, ptx, 0o644); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < b.N; i++ {
			if out, err := exec.Command(bin, "-arch=sm_90", "-O3", "-o", filepath.Join(dir, "m.cubin"), src).CombinedOutput(); err != nil {
				b.Fatalf("ptxas: %v\n%s", err, out)
			}
		}
	}
	for _, dt := range allDTypes {
		b.Run(dt.String(), func(b *testing.B) {
			_, ptx, err := PTX(9, 0, dt)
			if err != nil {
				b.Fatal(err)
			}
			run(b, ptx)
		})
	}
	b.Run("all", func(b *testing.B) {
		p, err := parsedPTX()
		if err != nil {
			b.Fatal(err)
		}
		run(b, p.module(p.archs[len(p.archs)-1], strings.Join(p.kernels[:], "")))
	})
}
