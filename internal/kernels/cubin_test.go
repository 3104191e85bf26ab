package kernels

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gccl/gccl/internal/reduce"
)

var update = flag.Bool("update", false, "rewrite cubin/ from the embedded PTX with ptxas (GCCL_PTXAS)")

// A device gets the machine code of the newest architecture of its major
// version not newer than itself; no other.
func TestCubinChoice(t *testing.T) {
	for _, c := range []struct {
		major, minor int
		want         string
	}{
		{9, 0, "sm_90"}, {9, 1, "sm_90"}, {8, 0, "sm_80"}, {8, 6, "sm_80"}, {8, 9, "sm_80"},
		{7, 0, "sm_70"}, {7, 5, "sm_70"}, {10, 0, ""}, {12, 0, ""}, {6, 1, ""},
	} {
		if got := cubinArch(c.major, c.minor); got != c.want {
			t.Errorf("compute capability %d.%d: %q, want %q", c.major, c.minor, got, c.want)
		}
	}
	if _, img, err := Cubin(10, 0, reduce.Float32); img != nil || err != nil {
		t.Errorf("Cubin for sm_100: %d bytes, %v; want none (the PTX)", len(img), err)
	}
}

// Every embedded image is a CUDA ELF that defines its type's six kernels,
// and nothing else is embedded.
func TestCubinsDefineTheirKernels(t *testing.T) {
	names := map[string]bool{}
	for _, a := range cubinArchs {
		for _, dt := range allDTypes {
			arch, img, err := Cubin(a.major, a.minor, dt)
			if err != nil || arch != a.name {
				t.Fatalf("%s %v: %s, %v", a.name, dt, arch, err)
			}
			names["cubin/"+cubinName(arch, dt)] = true
			funcs, err := cubinFuncs(img)
			if err != nil {
				t.Fatalf("%s %v: %v", arch, dt, err)
			}
			for _, op := range allOps {
				name, _ := ReduceEntry(dt, op)
				if !slices.Contains(funcs, name) {
					t.Errorf("%s %v: no %s among %v", arch, dt, name, funcs)
				}
			}
		}
	}
	entries, err := cubins.ReadDir("cubin")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !names["cubin/"+e.Name()] {
			t.Errorf("cubin/%s is embedded but no device would load it", e.Name())
		}
	}
}

// The machine code is what ptxas makes of the embedded PTX: after a change
// to the kernels, build.sh and then go test -run TestCubinsMatchPTX
// -update ./internal/kernels (with GCCL_PTXAS) bring it up to date.
func TestCubinsMatchPTX(t *testing.T) {
	if testing.Short() {
		t.Skip("assembling 36 modules takes tens of seconds")
	}
	bin := ptxas(t)
	for _, a := range cubinArchs {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for _, dt := range allDTypes {
				_, ptx, err := PTX(a.major, a.minor, dt)
				if err != nil {
					t.Fatal(err)
				}
				src, out := filepath.Join(dir, "m.ptx"), filepath.Join(dir, "m.cubin")
				if err := os.WriteFile(src, ptx, 0o644); err != nil {
					t.Fatal(err)
				}
				if msg, err := exec.Command(bin, "-arch="+a.name, "-O3", "-o", out, src).CombinedOutput(); err != nil {
					t.Fatalf("ptxas -arch=%s %v: %v\n%s", a.name, dt, err, msg)
				}
				want, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				if *update {
					var z bytes.Buffer
					w, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
					w.Write(want)
					w.Close()
					if err := os.WriteFile(filepath.Join("cubin", cubinName(a.name, dt)), z.Bytes(), 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				_, got, err := Cubin(a.major, a.minor, dt)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s %v: the embedded machine code (%d bytes) is not ptxas's of the embedded PTX (%d bytes): run go test -run TestCubinsMatchPTX -update ./internal/kernels", a.name, dt, len(got), len(want))
				}
			}
		})
	}
}

// cubinFuncs returns the functions a cubin defines. (debug/elf refuses
// cubins: their e_version holds the CUDA version.)
func cubinFuncs(img []byte) ([]string, error) {
	le := binary.LittleEndian
	if len(img) < 64 || string(img[:4]) != elf.ELFMAG || elf.Class(img[4]) != elf.ELFCLASS64 || elf.Data(img[5]) != elf.ELFDATA2LSB {
		return nil, errors.New("not a little-endian 64-bit ELF")
	}
	if m := elf.Machine(le.Uint16(img[18:])); m != elf.EM_CUDA {
		return nil, fmt.Errorf("an ELF for %v, want EM_CUDA", m)
	}
	shoff, shentsize, shnum := le.Uint64(img[40:]), uint64(le.Uint16(img[58:])), uint64(le.Uint16(img[60:]))
	if shentsize < 64 || shoff+shnum*shentsize > uint64(len(img)) {
		return nil, errors.New("section headers out of the image")
	}
	section := func(i uint64) (typ uint32, off, size uint64, link uint32, err error) {
		if i >= shnum {
			return 0, 0, 0, 0, fmt.Errorf("no section %d", i)
		}
		h := img[shoff+i*shentsize:]
		off, size = le.Uint64(h[24:]), le.Uint64(h[32:])
		if off+size > uint64(len(img)) {
			return 0, 0, 0, 0, fmt.Errorf("section %d out of the image", i)
		}
		return le.Uint32(h[4:]), off, size, le.Uint32(h[40:]), nil
	}
	var funcs []string
	for i := range shnum {
		typ, off, size, link, err := section(i)
		if err != nil {
			return nil, err
		}
		if elf.SectionType(typ) != elf.SHT_SYMTAB {
			continue
		}
		_, soff, ssize, _, err := section(uint64(link))
		if err != nil {
			return nil, err
		}
		strs := img[soff : soff+ssize]
		for sym := img[off : off+size]; len(sym) >= 24; sym = sym[24:] {
			name := uint64(le.Uint32(sym))
			if elf.ST_TYPE(sym[4]) != elf.STT_FUNC || name >= uint64(len(strs)) {
				continue
			}
			n := bytes.IndexByte(strs[name:], 0)
			if n < 0 {
				return nil, errors.New("unterminated symbol name")
			}
			funcs = append(funcs, string(strs[name:name+uint64(n)]))
		}
	}
	return funcs, nil
}
