//go:build linux && cgo

package nvml

/*
#include <stdint.h>

// Trampolines: NVML's entry points are function pointers from dlsym, called
// with the C signatures nvml.h declares (nvmlReturn_t and enums are ints,
// nvmlDevice_t a pointer).
typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} pci_info;
static int c_void(void *f) { return ((int (*)(void))f)(); }
static const char *c_error_string(void *f, int r) { return ((const char *(*)(int))f)(r); }
static int c_count(void *f, unsigned *n) { return ((int (*)(unsigned *))f)(n); }
static int c_handle(void *f, unsigned i, void **d) { return ((int (*)(unsigned, void **))f)(i, d); }
static int c_pci(void *f, void *d, pci_info *p) { return ((int (*)(void *, pci_info *))f)(d, p); }
static int c_cc(void *f, void *d, int *major, int *minor) { return ((int (*)(void *, int *, int *))f)(d, major, minor); }
static int c_link_pci(void *f, void *d, unsigned link, pci_info *p) {
	return ((int (*)(void *, unsigned, pci_info *))f)(d, link, p);
}
static int c_link_u32(void *f, void *d, unsigned link, unsigned *out) {
	return ((int (*)(void *, unsigned, unsigned *))f)(d, link, out);
}
*/
import "C"

import (
	"unsafe"

	"github.com/gccl/gccl/internal/dl"
)

// DefaultLibrary is the library Open loads for an empty path.
const DefaultLibrary = "libnvidia-ml.so.1"

// Library is a loaded NVML. Calls whose entry point the library lacks
// return ErrorFunctionNotFound.
type Library struct {
	lib *dl.Library

	init, shutdown, errorString, count, handle, pciInfo unsafe.Pointer
	computeCapability, linkState, linkRemotePCI         unsafe.Pointer
	linkRemoteType                                      unsafe.Pointer
}

// Open loads NVML from path (DefaultLibrary if empty). The error is the
// dynamic loader's message; a library without NVML's basic entry points
// is refused.
func Open(path string) (*Library, error) {
	if path == "" {
		path = DefaultLibrary
	}
	lib, err := dl.Open(path)
	if err != nil {
		return nil, err
	}
	l := &Library{
		lib:               lib,
		init:              lib.Sym("nvmlInit_v2"),
		shutdown:          lib.Sym("nvmlShutdown"),
		errorString:       lib.Sym("nvmlErrorString"),
		count:             lib.Sym("nvmlDeviceGetCount_v2"),
		handle:            lib.Sym("nvmlDeviceGetHandleByIndex_v2"),
		pciInfo:           lib.Sym("nvmlDeviceGetPciInfo_v3"),
		computeCapability: lib.Sym("nvmlDeviceGetCudaComputeCapability"),
		linkState:         lib.Sym("nvmlDeviceGetNvLinkState"),
		linkRemotePCI:     lib.Sym("nvmlDeviceGetNvLinkRemotePciInfo_v2"),
		linkRemoteType:    lib.Sym("nvmlDeviceGetNvLinkRemoteDeviceType"),
	}
	for _, need := range []struct {
		name string
		sym  unsafe.Pointer
	}{
		{"nvmlInit_v2", l.init}, {"nvmlShutdown", l.shutdown}, {"nvmlErrorString", l.errorString},
		{"nvmlDeviceGetCount_v2", l.count}, {"nvmlDeviceGetHandleByIndex_v2", l.handle},
		{"nvmlDeviceGetPciInfo_v3", l.pciInfo},
	} {
		if need.sym == nil {
			lib.Close()
			return nil, &missingSymbolError{path: path, name: need.name}
		}
	}
	return l, nil
}

type missingSymbolError struct{ path, name string }

func (e *missingSymbolError) Error() string {
	return e.path + " has no " + e.name + ": not an NVML library, or too old"
}

// Close unloads the library; call it after Shutdown.
func (l *Library) Close() { l.lib.Close() }

// Init is nvmlInit_v2.
func (l *Library) Init() Return { return Return(C.c_void(l.init)) }

// Shutdown is nvmlShutdown.
func (l *Library) Shutdown() Return { return Return(C.c_void(l.shutdown)) }

// ErrorString is nvmlErrorString: NVML's name for r.
func (l *Library) ErrorString(r Return) string {
	return C.GoString(C.c_error_string(l.errorString, C.int(r)))
}

// DeviceGetCount is nvmlDeviceGetCount_v2.
func (l *Library) DeviceGetCount() (int, Return) {
	var n C.unsigned
	r := Return(C.c_count(l.count, &n))
	return int(n), r
}

// DeviceGetHandleByIndex is nvmlDeviceGetHandleByIndex_v2.
func (l *Library) DeviceGetHandleByIndex(i int) (Device, Return) {
	if i < 0 {
		return 0, ErrorInvalidArgument
	}
	var d unsafe.Pointer
	r := Return(C.c_handle(l.handle, C.unsigned(i), &d))
	return Device(d), r
}

// DeviceGetPCIBusID is the busId of nvmlDeviceGetPciInfo_v3:
// "00000000:82:00.0".
func (l *Library) DeviceGetPCIBusID(d Device) (string, Return) {
	var p C.pci_info
	r := Return(C.c_pci(l.pciInfo, devicePointer(d), &p))
	return C.GoString(&p.busId[0]), r
}

// DeviceGetCudaComputeCapability is nvmlDeviceGetCudaComputeCapability.
func (l *Library) DeviceGetCudaComputeCapability(d Device) (major, minor int, r Return) {
	if l.computeCapability == nil {
		return 0, 0, ErrorFunctionNotFound
	}
	var ma, mi C.int
	r = Return(C.c_cc(l.computeCapability, devicePointer(d), &ma, &mi))
	return int(ma), int(mi), r
}

// DeviceGetNvLinkState is nvmlDeviceGetNvLinkState: whether link is up.
func (l *Library) DeviceGetNvLinkState(d Device, link int) (bool, Return) {
	if l.linkState == nil {
		return false, ErrorFunctionNotFound
	}
	var state C.unsigned
	r := Return(C.c_link_u32(l.linkState, devicePointer(d), C.unsigned(link), &state))
	return state == 1, r // NVML_FEATURE_ENABLED
}

// DeviceGetNvLinkRemotePCIBusID is the busId of
// nvmlDeviceGetNvLinkRemotePciInfo_v2: what link reaches.
func (l *Library) DeviceGetNvLinkRemotePCIBusID(d Device, link int) (string, Return) {
	if l.linkRemotePCI == nil {
		return "", ErrorFunctionNotFound
	}
	var p C.pci_info
	r := Return(C.c_link_pci(l.linkRemotePCI, devicePointer(d), C.unsigned(link), &p))
	return C.GoString(&p.busId[0]), r
}

// DeviceGetNvLinkRemoteDeviceType is nvmlDeviceGetNvLinkRemoteDeviceType.
func (l *Library) DeviceGetNvLinkRemoteDeviceType(d Device, link int) (NVLinkDeviceType, Return) {
	if l.linkRemoteType == nil {
		return NVLinkUnknown, ErrorFunctionNotFound
	}
	var t C.unsigned
	r := Return(C.c_link_u32(l.linkRemoteType, devicePointer(d), C.unsigned(link), &t))
	return NVLinkDeviceType(t), r
}

// devicePointer turns a handle back into the pointer NVML gave: it points
// into NVML's own memory, never Go's.
func devicePointer(d Device) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&d))
}
