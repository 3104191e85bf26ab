// Package cuda is gccl's binding to the CUDA driver API (libcuda.so.1),
// loaded at run time with dlopen so that gccl builds and runs where no CUDA
// toolkit or driver is installed. It declares only the calls gccl uses, by
// their versioned symbol names (cuMemAlloc_v2, ...), and reports every
// failure with the driver's error name.
//
// Without a driver, or without cgo, Load returns an error wrapping
// ErrNotSupported that says why. GCCL_CUDA_LIBRARY names another library to
// load instead of libcuda.so.1 (tests use a fake one).
//
// gccl's users of the driver in one process (p2p agents, gpu devices)
// share it through OpenShared: one driver, one retained primary context
// per device, values kept per context, and each peer allocation opened
// through CUDA IPC once per context, counted.
package cuda

import (
	"errors"
	"fmt"

	"github.com/gccl/gccl/internal/errs"
)

// ErrNotSupported is wrapped by Load's error when the driver cannot be used
// here: no cgo, not Linux, no libcuda.so.1, or a library without the calls
// gccl needs.
var ErrNotSupported error = errs.New(errs.ErrNotSupported, "cuda: not supported on this system")

// ErrClosed is returned by calls through a Driver after its Close (and
// through its Contexts).
var ErrClosed error = errs.New(errs.ErrClosed, "cuda: driver closed")

// ErrOutsideAllocation is wrapped by PointerInfo.CheckRange's error for a
// range that runs past the allocation holding its start.
var ErrOutsideAllocation = errors.New("runs past the end of its allocation")

// Result is a CUresult, the status every driver call returns.
type Result int

// The results gccl tests for; the rest are named by resultNames.
const (
	Success         Result = 0
	ErrInvalidValue Result = 1
	ErrOutOfMemory  Result = 2
	ErrNoDevice     Result = 100
	ErrNotReady     Result = 600
)

// resultNames are the driver's names of its results (cuda.h's CUresult),
// used when the loaded driver cannot name a result itself.
var resultNames = map[Result]string{
	0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
	3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 5: "CUDA_ERROR_PROFILER_DISABLED",
	6: "CUDA_ERROR_PROFILER_NOT_INITIALIZED", 7: "CUDA_ERROR_PROFILER_ALREADY_STARTED",
	8: "CUDA_ERROR_PROFILER_ALREADY_STOPPED", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
	200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT", 202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
	205: "CUDA_ERROR_MAP_FAILED", 206: "CUDA_ERROR_UNMAP_FAILED", 207: "CUDA_ERROR_ARRAY_IS_MAPPED",
	208: "CUDA_ERROR_ALREADY_MAPPED", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU", 210: "CUDA_ERROR_ALREADY_ACQUIRED",
	211: "CUDA_ERROR_NOT_MAPPED", 212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", 213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE", 215: "CUDA_ERROR_UNSUPPORTED_LIMIT", 216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
	217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", 218: "CUDA_ERROR_INVALID_PTX", 219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
	220: "CUDA_ERROR_NVLINK_UNCORRECTABLE", 221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
	224: "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", 300: "CUDA_ERROR_INVALID_SOURCE", 301: "CUDA_ERROR_FILE_NOT_FOUND",
	302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", 303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
	304: "CUDA_ERROR_OPERATING_SYSTEM", 400: "CUDA_ERROR_INVALID_HANDLE", 401: "CUDA_ERROR_ILLEGAL_STATE",
	500: "CUDA_ERROR_NOT_FOUND",
	600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS", 701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT", 703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
	704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", 705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", 709: "CUDA_ERROR_CONTEXT_IS_DESTROYED", 710: "CUDA_ERROR_ASSERT",
	711: "CUDA_ERROR_TOO_MANY_PEERS", 712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", 714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
	715: "CUDA_ERROR_ILLEGAL_INSTRUCTION", 716: "CUDA_ERROR_MISALIGNED_ADDRESS", 717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	718: "CUDA_ERROR_INVALID_PC", 719: "CUDA_ERROR_LAUNCH_FAILED", 720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
	800: "CUDA_ERROR_NOT_PERMITTED", 801: "CUDA_ERROR_NOT_SUPPORTED", 802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	805: "CUDA_ERROR_MPS_CONNECTION_FAILED", 806: "CUDA_ERROR_MPS_RPC_FAILURE", 807: "CUDA_ERROR_MPS_SERVER_NOT_READY",
	808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", 809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
	900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	902: "CUDA_ERROR_STREAM_CAPTURE_MERGE", 903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
	904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
	906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 907: "CUDA_ERROR_CAPTURED_EVENT",
	908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", 909: "CUDA_ERROR_TIMEOUT", 910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
	999: "CUDA_ERROR_UNKNOWN",
}

// Name returns the driver's name for r, or "CUDA_ERROR_<n>" for a result
// this table does not know (a newer driver's).
func (r Result) Name() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUDA_ERROR_%d", int(r))
}

// Error is a failed driver call.
type Error struct {
	Call   string // the driver symbol, e.g. "cuMemAlloc_v2"
	Result Result
	Name   string // the result's name, from the driver when it can say
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Call, e.Name, int(e.Result))
}

// Is lets errors.Is match an *Error by result: errors.Is(err,
// &cuda.Error{Result: cuda.ErrOutOfMemory}).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Result == e.Result && (t.Call == "" || t.Call == e.Call)
}

// Stream, Event, Module and Function are driver handles (CUstream,
// CUevent, CUmodule, CUfunction). The zero Stream is the legacy default
// stream.
type (
	Stream   uintptr
	Event    uintptr
	Module   uintptr
	Function uintptr
)

// WaitCond is how a stream's WaitValue32 compares the word with its value
// (CUstreamWaitValue_flags).
type WaitCond uint32

// The comparisons of WaitValue32.
const (
	WaitGEQ WaitCond = 0 // (int32)(word - value) >= 0
	WaitEQ  WaitCond = 1 // word == value
)

// MemOp is one stream memory operation of Context.BatchMemOps, laid out
// as the driver's CUstreamBatchMemOpParams (a union of 48 bytes: the
// operation, the address, the value, the flags, a word for the driver).
// WaitValueOp and WriteValueOp make them.
type MemOp struct {
	kind  uint32
	_     uint32
	addr  uint64
	value uint64 // the 32-bit operations use its low half (little-endian)
	flags uint32
	_     uint32
	_     [2]uint64 // the driver's alias, and the union's padding
}

// The operations of a MemOp (CUstreamBatchMemOpType).
const (
	memOpWaitValue32  = 1
	memOpWriteValue32 = 2
)

// MaxBatchMemOps is the most operations BatchMemOps takes at once (the
// driver's bound: fewer than 256).
const MaxBatchMemOps = 255

// WaitValueOp is WaitValue32 as an operation of a batch.
func WaitValueOp(p DevicePtr, v uint32, cond WaitCond) MemOp {
	return MemOp{kind: memOpWaitValue32, addr: uint64(p), value: uint64(v), flags: uint32(cond)}
}

// WriteValueOp is a store of v into the 32-bit word at device address p
// (cuStreamWriteValue32's), made once the writes of the work queued on the
// stream before it are visible, to the host and to other devices (the
// default flags' memory barrier). p is typically mapped host memory
// (AllocHostMapped, HostRegisterMapped) that the host or a peer's stream
// waits on.
func WriteValueOp(p DevicePtr, v uint32) MemOp {
	return MemOp{kind: memOpWriteValue32, addr: uint64(p), value: uint64(v)}
}

// MemoryType is where a pointer's memory is (CUmemorytype).
type MemoryType uint32

// The memory types PointerInfo reports.
const (
	MemoryHost    MemoryType = 1
	MemoryDevice  MemoryType = 2
	MemoryArray   MemoryType = 3
	MemoryUnified MemoryType = 4
)

func (m MemoryType) String() string {
	switch m {
	case MemoryHost:
		return "host"
	case MemoryDevice:
		return "device"
	case MemoryArray:
		return "array"
	case MemoryUnified:
		return "unified"
	}
	return fmt.Sprintf("memory type %d", uint32(m))
}

// CheckRange says why n bytes at p, which info describes, are not device
// memory of device ordinal inside one allocation; nil when they are.
func (info PointerInfo) CheckRange(p DevicePtr, n uint64, ordinal int) error {
	switch {
	case info.Type == MemoryHost:
		return fmt.Errorf("%#x is pinned host memory", uint64(p))
	case info.Device != ordinal:
		return fmt.Errorf("%#x is memory of device %d, not of device %d", uint64(p), info.Device, ordinal)
	case uint64(p)+n < uint64(p) || uint64(p)+n > uint64(info.Base)+uint64(info.Size):
		return fmt.Errorf("%d bytes at %#x: %w [%#x, +%d)", n, uint64(p), ErrOutsideAllocation, uint64(info.Base), info.Size)
	}
	return nil
}

// PointerInfo is what the driver knows of an address (Context.PointerInfo).
type PointerInfo struct {
	Type   MemoryType
	Device int       // the ordinal of the device it was allocated or registered on
	Base   DevicePtr // the allocation holding it, [Base, Base+Size)
	Size   int
}

// Attr is a CUdevice_attribute.
type Attr int

// The device attributes gccl reads.
const (
	AttrMultiProcessorCount    Attr = 16
	AttrPCIBusID               Attr = 33
	AttrPCIDeviceID            Attr = 34
	AttrComputeCapabilityMajor Attr = 75
	AttrComputeCapabilityMinor Attr = 76
	AttrPCIDomainID            Attr = 50
	// AttrDmaBufSupported: the device exports its memory as dma-buf file
	// descriptors (DmaBufFD; CUDA 11.7 and a driver of R515 or later).
	AttrDmaBufSupported Attr = 124
	// AttrMPSEnabled: contexts on the device are shared through NVIDIA's
	// Multi-Process Service (drivers of CUDA 12.4 and later; older ones
	// refuse the attribute).
	AttrMPSEnabled Attr = 133
)

// symbols are the driver entry points gccl uses, by the names the driver
// exports for the API version gccl declares (the _v2 entry points take
// 64-bit sizes and device pointers). Load fails, naming the first one
// missing, if the library lacks any.
var symbols = []string{
	"cuInit",
	"cuDriverGetVersion",
	"cuGetErrorName",
	"cuDeviceGetCount",
	"cuDeviceGet",
	"cuDeviceGetAttribute",
	"cuDeviceGetPCIBusId",
	"cuDevicePrimaryCtxRetain",
	"cuDevicePrimaryCtxRelease_v2",
	"cuCtxSetCurrent",
	"cuCtxSynchronize",
	"cuStreamCreate",
	"cuStreamSynchronize",
	"cuStreamQuery",
	"cuStreamWaitEvent",
	"cuStreamDestroy_v2",
	"cuStreamWaitValue32_v2",
	"cuEventCreate",
	"cuEventRecord",
	"cuEventSynchronize",
	"cuEventQuery",
	"cuEventDestroy_v2",
	"cuMemAlloc_v2",
	"cuMemFree_v2",
	"cuMemAllocHost_v2",
	"cuMemFreeHost",
	"cuMemHostAlloc",
	"cuMemHostGetDevicePointer_v2",
	"cuMemHostRegister_v2",
	"cuMemHostUnregister",
	"cuMemcpyHtoDAsync_v2",
	"cuMemcpyDtoHAsync_v2",
	"cuMemcpyDtoDAsync_v2",
	"cuMemsetD8Async",
	"cuMemGetAddressRange_v2",
	"cuPointerGetAttribute",
	"cuIpcGetMemHandle",
	"cuIpcOpenMemHandle_v2",
	"cuIpcCloseMemHandle",
	"cuModuleLoadData",
	"cuModuleUnload",
	"cuModuleGetFunction",
	"cuLaunchKernel",
}

// optionalSymbols are entry points gccl uses where the driver has them;
// Load resolves them when present and the calls that need them report
// ErrNotSupported otherwise.
var optionalSymbols = []string{
	"cuMemGetHandleForAddressRange", // DmaBufFD: CUDA 11.7
	"cuStreamBatchMemOp_v2",         // BatchMemOps: CUDA 11.7
}

// Symbols returns the driver entry points gccl resolves at Load.
func Symbols() []string { return append([]string(nil), symbols...) }
