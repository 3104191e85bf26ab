package nvml

// Return is an nvmlReturn_t: Success, or why a call failed.
type Return int32

// The nvmlReturn_t values gccl tells apart; Library.ErrorString names any.
const (
	Success               Return = 0
	ErrorUninitialized    Return = 1
	ErrorInvalidArgument  Return = 2
	ErrorNotSupported     Return = 3
	ErrorLibraryNotFound  Return = 12
	ErrorFunctionNotFound Return = 13
)

// MaxLinks is NVML_NVLINK_MAX_LINKS: NVLink indices run below it.
const MaxLinks = 36

// NVLinkDeviceType is an nvmlIntNvLinkDeviceType_t: what is at the far
// end of an NVLink.
type NVLinkDeviceType uint32

// The far ends of an NVLink.
const (
	NVLinkGPU     NVLinkDeviceType = 0x00
	NVLinkIBMNPU  NVLinkDeviceType = 0x01
	NVLinkSwitch  NVLinkDeviceType = 0x02
	NVLinkUnknown NVLinkDeviceType = 0xFF
)

// Device is an nvmlDevice_t, a handle valid between Init and Shutdown.
type Device uintptr
