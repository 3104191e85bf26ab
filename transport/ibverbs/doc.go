// Package ibverbs is gccl's RDMA transport: slot rings between ranks on
// InfiniBand or RoCE ports, moved by RDMA WRITEs over reliable-connected
// queue pairs (internal/verbs, libibverbs loaded at run time). It registers
// itself as "IB", after shared memory and before TCP, so it carries the
// pairs of ranks on different hosts whose ports share a fabric, and pairs
// of one host when shared memory is off.
//
// # Choosing it
//
// Listen looks for RDMA devices (sysfs). Without any, or with
// GCCL_IB_DISABLE=1, it does nothing, and no peer expects RDMA. With
// devices, it picks the port nearest the rank (verbs.Choose, GCCL_IB_HCA),
// checks that RLIMIT_MEMLOCK lets it pin the rings (unless the process has
// CAP_IPC_LOCK), opens the device and publishes the port in the rank's
// descriptor (link layer, GID and its type, MTU, QPs per connection); or
// publishes why it cannot (a port down, the memlock limit with the bytes
// needed and the fix). Reach expects RDMA between ranks of different hosts
// that both have devices, connects them when both published a port of the
// same link layer and, on Ethernet, the same GID type, and otherwise says
// why, so that the registry logs "rank a -> b via TCP instead of IB
// (reason)", or fails Init under GCCL_STRICT=1.
//
// # Connecting
//
// Each pair gets, on each side, one registered region (a receive ring, a
// send ring, control words; layout.go) and GCCL_IB_QPS_PER_CONNECTION RC
// QPs (the smaller of the two ranks' values; default 1, as NCCL's), made
// at the pair's first use (pair.go): the endpoint's first Sender or
// Receiver for the peer, so that a rank pins rings only for the peers its
// plans use. Connect itself makes the completion queue and returns. A
// goroutine per pair registers the region, creates the QPs and exchanges
// the QP numbers, the region's address and key and the geometry through
// the job's key-value store (the bootstrap's): publish this side, read the
// peer's, connect the QPs (INIT -> RTR -> RTS), publish whether that
// worked, read the peer's verdict. Until then sends wait in the send ring
// (at most SlotCount) and receives find nothing, so ranks may first use a
// pair in any order; the outcome is applied by the owner's next call, or by
// the set-up goroutine itself when the owner is away, so that queued
// messages go out while the rank waits elsewhere. GCCL_RUNTIME_CONNECT=0
// connects every pair in Connect instead, as NCCL_RUNTIME_CONNECT=0 does.
//
// A pair that failed on either side (a QP that did not reach RTR, with the
// driver's errno; memory the kernel would not register) is carried by TCP
// instead, with a WARN on both sides naming the pair and the reason, and
// what it had queued moves there in order; under GCCL_STRICT=1 the pair
// fails instead (its first use on both sides, or Connect at Init). Before
// a side applies such a failure, both record it and tell each other so
// (one more round through the store), so that a rank whose peer exits on
// the failure reports the failure, not a lost peer (SetupFailure). The TCP
// fallback listens from Listen on, its address in the rank's descriptor,
// and connects only the pairs that move to it. The endpoint's name is
// "NET/IB/<device>:<port>", which Comm.Via and gccl-perf's header show per
// pair ("TCP" for a pair that fell back); each pair's port, GID and QP
// count are logged at INFO when it comes up.
//
// # Moving data
//
// A sender's TryReserve hands out slot tail%count of its send ring; the
// executor writes (or reduces) into it in place. Commit writes the slot's
// header (length, sequence number, tag, and a piggybacked credit) and posts
// one RDMA WRITE with immediate per piece: a message of 128 KiB or more is
// cut into one piece per QP on page boundaries, each written to the same
// offset of the same slot of the peer's receive ring. The immediate carries
// the message's sequence number (25 bits) and piece count, so the receiver
// counts pieces per slot from its completions and makes a message visible
// once all its pieces and all earlier messages have landed. The receiver's
// TryNext returns the slot in place; Release frees it, and the sender
// learns of it by credit: the receiver's head, in the header of its next
// message the other way, or in an RDMA WRITE with immediate into the
// sender's control area once half the ring is owed, when the receiver finds
// nothing to take, or before it sleeps. At most count messages are in
// flight per direction; every queue is sized for the worst case, so no post
// can find its queue full. Close and Abort send a notice the same way (an
// abort writes its reason into the peer's control area first). Nothing is
// allocated per message.
//
// # Progress and sleep
//
// All work happens on the rank's own goroutine: the Try calls poll the CQ
// (ibv_poll_cq, no system call) when a ring looks empty or full, handle
// what completed and post again the receives consumed. A rank about to
// sleep on its bell (Mux.Wait calls PrepareWait) arms the CQ's completion
// channel and polls once more; a waiter goroutine sleeps on the channel and
// rings the bell at the next completion. Only an armed channel fires, so a
// rank that polls is never woken per message.
//
// # Failures
//
// A work completion in error fails its pair: every call on it returns a
// transport.PeerError naming the rank, the HCA, the QP and the status
// ("transport retry counter exceeded" wraps transport.ErrPeerClosed, so the
// communicator reports a lost peer), and the pair's QPs are flushed. A
// killed peer's QPs vanish with its process: writes to it are retried
// GCCL_IB_RETRY_CNT times GCCL_IB_TIMEOUT apart (about 35 s with NCCL's
// defaults) before they fail, so the rendezvous' loss notice, which comes
// within a second, usually ends the survivors' operations first. Close and
// Abort destroy the QPs, deregister the memory, destroy the CQ and its
// completion channel and close the device (verbs.Live counts them).
//
// # Not yet
//
// Device buffers cross hosts through registered host staging (the
// executor's); GPUDirect RDMA registration of device memory comes with the
// p2p RDMA work. The transport has run on Soft-RoCE (rdma_rxe) in qemu
// VMs only (tests/rxe), never on a real NIC.
package ibverbs
