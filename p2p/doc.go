// Package p2p is gccl's point-to-point transfer agent, in the manner of NIXL:
// the piece of a disaggregated inference server that moves KV-cache blocks
// between prefill and decode workers and offloads them to files.
//
// Each process makes one named Agent. The agent registers memory once
// (DRAM regions, on the heap or in shared memory from Agent.Alloc; VRAM
// regions, GPU memory through the CUDA driver loaded at run time; and FILE
// regions), publishes a metadata blob (LocalMetadata) that peers load once
// (LoadRemote, through the gccl bootstrap store or directly over a socket
// with Agent.Connect), and then posts asynchronous one-sided READ and WRITE
// requests made of many small descriptors. The target process runs no code
// per transfer beyond its progress goroutine; the initiator learns of
// completion by polling (Request.Status), blocking (Request.Wait) or a
// callback, and the target learns of data by notifications (GetNotifs),
// which it sees only after the data of their request is visible.
//
// The backend of a request is chosen from where both ends live and logged
// (GCCL_DEBUG=INFO GCCL_DEBUG_SUBSYS=P2P):
//
//   - local: both ends in this process (a memory copy);
//   - shm: the target's region is in shared memory on this host, mapped at
//     LoadRemote; the initiator copies straight into or out of it;
//   - pvm: the target's region is on its heap on this host;
//     process_vm_readv/process_vm_writev copy it once in the kernel (probed at
//     LoadRemote, since it needs ptrace permission);
//   - tcp: everything else, across hosts or with shared memory disabled
//     (Config.DisableSHM, GCCL_SHM_DISABLE=1): one connection per peer pair,
//     whose progress goroutine on the target bounds-checks every descriptor
//     and reads WRITE data straight into the registered region;
//   - file: the target is a FILE region of this agent: parallel pread/pwrite
//     with a configurable queue depth and block size, O_DIRECT optional;
//   - cudaipc: the target is a peer's VRAM on this host, whose CUDA IPC
//     handle is opened at LoadRemote; the initiator copies on the GPU
//     (device to device, or host to device and back).
//
// VRAM (Agent.RegisterVRAM; descriptors carry the device address and the
// device ordinal) may be either end of a request. The local and shm
// backends copy through the driver when an end is VRAM (one stream per
// request and device, one event waited for per part, DRAM pinned once);
// tcp and file stage VRAM through pinned bounce buffers, on the side that
// holds it. Without a CUDA driver, or without cgo, RegisterVRAM returns
// ErrNotSupported. The agent shares the process's CUDA driver, primary
// contexts and CUDA IPC mappings with the process's other users of them
// (internal/cuda's Shared).
//
// A peer whose connection ends or goes silent for Config.PeerTimeout fails
// its in-flight requests with ErrRemoteDisconnect and is forgotten; a
// request that does not finish within Config.RequestTimeout fails with
// ErrTimeout. docs/P2P.md describes the design, the ordering guarantees and
// the measured performance.
package p2p
