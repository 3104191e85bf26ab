// Package bootstrap is gccl's out-of-band rendezvous: once per job, the ranks
// find each other, prove they belong to the job, check that they run the same
// gccl build, and exchange one descriptor each. Afterwards it only carries
// heartbeats, abort notices, Split, Shrink and Grow; it is never on the data
// path.
//
// # Finding the job
//
// FromEnv reads the launcher's environment (explicit GCCL_* variables,
// torchrun, Open MPI, PMI/Hydra, Slurm, in that order of precedence) and
// returns a Config; Join connects to the rendezvous at Config.Addr. By
// default rank 0 serves the rendezvous in-process (Config.Serve); a large job
// can run the standalone server cmd/gccl-bootstrap instead and set
// GCCL_BOOTSTRAP_SERVE=0.
//
// # The rendezvous
//
// The rendezvous is a gRPC service (bootstrappb/bootstrap.proto) holding a
// key-value store in the manner of PyTorch's TCPStore (Set, blocking Get, Add,
// CompareAndSet, Wait, Delete) and collective rounds (AllGather, Barrier):
// each rank sends one RPC per round and the server answers all of them once
// every member arrived, so a round costs O(n) messages at the server. Every
// rank keeps exactly one gRPC connection to the server; sub-clients made by
// Split and Shrink share it, and it stays up until the last of them closes.
//
// # Failures
//
// Each rank keeps a heartbeat stream open. The server declares a rank lost
// when its stream breaks before it left cleanly (Close) or goes silent for
// longer than the heartbeat timeout (3 s by default), and tells every other
// rank through its Lost channel; collective rounds that need a lost rank fail
// with ErrRankLost instead of hanging, and rounds that do not need it go on.
// Abort gives up on one group (the job, or a group made by Split or
// Shrink): it tells the group's ranks and fails their pending and later
// blocking calls of that group with ErrAborted; other groups are not
// touched. So the survivors of a failure can Shrink the group they were
// in, excluding the lost ranks, and go on. A rank that leaves (closes its
// last client) is no failure and aborts nothing, but LostRanks names it
// too: it can be in no later group. If the rendezvous itself
// goes away, pending calls fail with ErrRendezvousLost. Every blocking call is
// bounded by its context and by Config.Timeout (60 s by default), and a
// timeout names what was missing (which ranks, which keys).
//
// # Growing
//
// Grow admits newcomers to a group: processes started after the job (a
// replacement for a lost rank, a new host) that call JoinGrow (or
// NewcomerFromEnv's Config: the job's address and secret) instead of Join.
// Every member calls Grow with the same size; the newcomers, which may come
// before or after, take the ranks after the members' and get new job ranks
// (a lost rank's never returns). From then on the rendezvous treats them as
// any rank: heartbeats, notices, Leave, LostRanks.
//
// # Security
//
// The rendezvous only admits calls that carry the job secret: 128 random
// bits as 32 hex characters (NewSecret), normally set by the launcher in
// GCCL_SECRET. The server compares it in constant time and answers a wrong
// one with ErrUnauthenticated. The secret proves membership of the job;
// without TLS it is sent over plain TCP (like NCCL's unique ID), so it does
// not protect against an attacker who can read the network between the
// hosts. With Config.TLS (GCCL_TLS=1) the rendezvous runs TLS 1.3 with a key
// derived from the secret, which every rank checks, and the secret travels
// inside it (see tls.go and docs/ARCHITECTURE.md, Encryption).
package bootstrap
