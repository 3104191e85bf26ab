// Package dl opens shared libraries at run time (dlopen), for the bindings
// of NVIDIA's libraries (internal/cuda, internal/cufile), which gccl loads
// only where they are installed so that it builds without them. It exists
// on Linux with cgo only, where those bindings do.
package dl
