package cuda

import (
	"errors"
	"strings"
	"testing"
	"unsafe"
)

func TestResultNames(t *testing.T) {
	for r, want := range map[Result]string{
		Success: "CUDA_SUCCESS", ErrOutOfMemory: "CUDA_ERROR_OUT_OF_MEMORY", ErrNoDevice: "CUDA_ERROR_NO_DEVICE",
		ErrNotReady: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS", 12345: "CUDA_ERROR_12345",
	} {
		if got := r.Name(); got != want {
			t.Errorf("Result(%d).Name() = %q, want %q", int(r), got, want)
		}
	}
	err := error(&Error{Call: "cuMemAlloc_v2", Result: ErrOutOfMemory, Name: ErrOutOfMemory.Name()})
	if got := err.Error(); got != "cuda: cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)" {
		t.Errorf("message %q", got)
	}
	if !errors.Is(err, &Error{Result: ErrOutOfMemory}) || errors.Is(err, &Error{Result: ErrNoDevice}) {
		t.Error("errors.Is does not match by result")
	}
}

// The symbol table: unique names, and the versioned entry points wherever
// the driver has them (calling an unversioned one would get the 32-bit-size
// ABI of CUDA 3.x).
func TestSymbolTable(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Symbols() {
		if seen[s] {
			t.Errorf("%s listed twice", s)
		}
		seen[s] = true
		if !strings.HasPrefix(s, "cu") {
			t.Errorf("%s is not a driver entry point", s)
		}
	}
	for _, s := range []string{"cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
		"cuMemcpyDtoDAsync_v2", "cuMemHostRegister_v2", "cuIpcOpenMemHandle_v2", "cuDevicePrimaryCtxRelease_v2",
		"cuStreamDestroy_v2", "cuEventDestroy_v2", "cuMemAllocHost_v2"} {
		if !seen[s] {
			t.Errorf("%s missing", s)
		}
		if seen[strings.TrimSuffix(s, "_v2")] {
			t.Errorf("the unversioned %s is listed", strings.TrimSuffix(s, "_v2"))
		}
	}
}

// CheckRange accepts device memory of the device inside its allocation,
// and says why anything else is not.
func TestPointerInfoCheckRange(t *testing.T) {
	dev := PointerInfo{Type: MemoryDevice, Device: 1, Base: 0x1000, Size: 0x100}
	for _, tc := range []struct {
		info    PointerInfo
		p       DevicePtr
		n       uint64
		ordinal int
		why     string // "" when accepted
	}{
		{dev, 0x1000, 0x100, 1, ""},
		{dev, 0x10f0, 0x10, 1, ""},
		{dev, 0x10f0, 0x11, 1, "runs past the end of its allocation"},
		{dev, 0x1000, ^uint64(0), 1, "runs past the end of its allocation"},
		{dev, 0x1000, 1, 0, "memory of device 1, not of device 0"},
		{PointerInfo{Type: MemoryHost, Device: 1, Base: 0x1000, Size: 0x100}, 0x1000, 1, 1, "pinned host memory"},
	} {
		err := tc.info.CheckRange(tc.p, tc.n, tc.ordinal)
		switch {
		case tc.why == "" && err != nil:
			t.Errorf("%+v: %d bytes at %#x on device %d: %v", tc.info, tc.n, tc.p, tc.ordinal, err)
		case tc.why != "" && (err == nil || !strings.Contains(err.Error(), tc.why)):
			t.Errorf("%+v: %d bytes at %#x on device %d: %v, want %q", tc.info, tc.n, tc.p, tc.ordinal, err, tc.why)
		}
		if tc.why == "runs past the end of its allocation" && !errors.Is(err, ErrOutsideAllocation) {
			t.Errorf("%v does not wrap ErrOutsideAllocation", err)
		}
	}
}

// The fallback table names results the fake driver (and a driver whose
// cuGetErrorName fails) cannot: the fake's own launch failure (719) among
// them. (TestInstalledDriverLibrary checks the table against a real driver.)
func TestResultNamesFallback(t *testing.T) {
	for r, want := range map[Result]string{719: "CUDA_ERROR_LAUNCH_FAILED", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 801: "CUDA_ERROR_NOT_SUPPORTED"} {
		if got := r.Name(); got != want {
			t.Errorf("Result(%d).Name() = %s, want %s", int(r), got, want)
		}
	}
}

// MemOp is the driver's CUstreamBatchMemOpParams: 48 bytes, the operation
// at 0, the address at 8, the value at 16, the flags at 24 (cuda.h).
func TestMemOpLayout(t *testing.T) {
	op := WaitValueOp(0x1000, 7, WaitEQ)
	if size := unsafe.Sizeof(op); size != 48 {
		t.Fatalf("MemOp is %d bytes, want 48", size)
	}
	for _, f := range []struct {
		name      string
		got, want uintptr
	}{
		{"operation", unsafe.Offsetof(op.kind), 0},
		{"address", unsafe.Offsetof(op.addr), 8},
		{"value", unsafe.Offsetof(op.value), 16},
		{"flags", unsafe.Offsetof(op.flags), 24},
	} {
		if f.got != f.want {
			t.Errorf("MemOp's %s at offset %d, want %d", f.name, f.got, f.want)
		}
	}
	if op.kind != 1 || op.addr != 0x1000 || op.value != 7 || op.flags != 1 {
		t.Errorf("WaitValueOp(0x1000, 7, WaitEQ) = %+v", op)
	}
	if w := WriteValueOp(0x2000, 9); w.kind != 2 || w.addr != 0x2000 || w.value != 9 || w.flags != 0 {
		t.Errorf("WriteValueOp(0x2000, 9) = %+v", w)
	}
}
