package comm

// The transports a multi-process communicator can use: each registers
// itself with package transport, which tries them in priority order
// (registry.go there). Adding one is its package plus a line here.
import (
	_ "github.com/gccl/gccl/transport/ibverbs"
	_ "github.com/gccl/gccl/transport/shm"
	_ "github.com/gccl/gccl/transport/tcp"
)
