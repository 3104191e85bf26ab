// Package nvml is gccl's binding of NVIDIA's management library
// (libnvidia-ml.so.1), loaded at run time as internal/cuda loads the
// driver: building needs no NVIDIA header or library, and running needs
// them only where NVML is called. It binds the few calls topology
// detection makes: devices, their PCI bus ids, compute capability and
// NVLinks. The loader exists on Linux with cgo; the types build anywhere.
package nvml
