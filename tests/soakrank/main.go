// Command soakrank is one process of the fault soak (tests/soak_test.go):
// a rank of a collective job (-mode coll, joined from the environment as
// gccl-run would launch it) or one of two p2p agents (-mode p2p) that
// transfer to each other, in a loop, until something fails.
//
// It prints "soakrank: NAME ready, shared segments: PATHS" (the /dev/shm
// files it maps) once its first operation succeeded, and creates
// -ready-file (the soak signals a victim only after every process is
// ready); on the first error it prints
//
//	soakrank: NAME failed at MONOTONIC_NS: ERROR
//
// then closes the communicator or agent and reports what outlived it:
//
//	soakrank: NAME resources: fds BEFORE -> AFTER, goroutines BEFORE -> AFTER
//
// BEFORE is counted before the communicator or agent existed (with the
// runtime's network poller already open), AFTER once Close returned and
// the goroutines it started had up to -settle to end; the stacks of
// goroutines still running follow. It exits 1 after a failure, 0 never
// (the loop runs until -timeout, which exits 2).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/leakcheck"
	"github.com/gccl/gccl/p2p"
)

func main() {
	mode := flag.String("mode", "coll", "coll: a rank of the job in the environment; p2p: one of two agents")
	count := flag.Int("count", 1<<18+3, "coll: elements of each all-reduce; p2p: bytes of each write")
	name := flag.String("name", "", "p2p: this agent's name")
	peer := flag.String("peer", "", "p2p: the other agent's name")
	dir := flag.String("dir", "", "p2p: directory where the two agents leave their metadata")
	peerTimeout := flag.Duration("peer-timeout", 3*time.Second, "p2p: Config.PeerTimeout")
	settle := flag.Duration("settle", 3*time.Second, "how long goroutines may take to end after Close")
	timeout := flag.Duration("timeout", 2*time.Minute, "whole-run deadline")
	readyFile := flag.String("ready-file", "", "created once the first operation succeeded (and the ready line printed)")
	flag.Parse()

	// Open the runtime's network poller (an epoll fd and an eventfd,
	// kept for the life of the process) before counting fds.
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
	}
	fdsBefore := openFDs()
	before := map[string]bool{}
	for _, g := range leakcheck.Wait(0, nil) {
		id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
		before[id] = true
	}
	gBefore := len(before)

	ready := func(who string) {
		fmt.Printf("soakrank: %s ready, shared segments: %s\n", who, strings.Join(sharedSegments(), " "))
		if *readyFile != "" {
			os.WriteFile(*readyFile, nil, 0o600)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var who string
	var err error
	var closeFn func()
	switch *mode {
	case "coll":
		who, closeFn, err = runColl(ctx, *count, ready)
	case "p2p":
		who, closeFn, err = runP2P(ctx, *name, *peer, *dir, *peerTimeout, *count, ready)
	default:
		err = fmt.Errorf("unknown -mode %q", *mode)
	}
	failedAt := monotonicNow()
	if err == nil {
		err = errors.New("the loop ended without an error")
	}
	fmt.Printf("soakrank: %s failed at %d: %v\n", who, failedAt, strings.ReplaceAll(err.Error(), "\n", " "))
	if ctx.Err() != nil {
		os.Exit(2)
	}
	if closeFn != nil {
		closeFn()
	}
	left := leakcheck.Wait(*settle, before)
	fmt.Printf("soakrank: %s resources: fds %d -> %d, goroutines %d -> %d\n", who, fdsBefore, openFDs(), gBefore, gBefore+len(left))
	for _, s := range left {
		fmt.Printf("soakrank: %s leaked goroutine:\n%s\n", who, s)
	}
	os.Exit(1)
}

// openFDs counts this process's open file descriptors (-1 where /proc has
// no fd directory).
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1 // the directory ReadDir had open
}

// sharedSegments lists the /dev/shm files this process maps, from
// /proc/self/maps (none where there is no such file).
func sharedSegments() []string {
	maps, _ := os.ReadFile("/proc/self/maps")
	seen := map[string]bool{}
	var out []string
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasPrefix(f[5], "/dev/shm/") || seen[f[5]] {
			continue
		}
		seen[f[5]] = true
		out = append(out, f[5])
	}
	return out
}

// runColl all-reduces in a loop until an operation fails.
func runColl(ctx context.Context, count int, ready func(string)) (string, func(), error) {
	c, err := comm.Init(ctx, nil)
	if err != nil {
		return "init", nil, err
	}
	who := fmt.Sprintf("rank %d", c.Rank())
	in, out := make([]int64, count), make([]int64, count)
	for i := range in {
		in[i] = int64(c.Rank() + i)
	}
	for it := 0; ; it++ {
		if err := comm.AllReduce(ctx, c, in, out, comm.Sum); err != nil {
			return who, func() { c.Close() }, err
		}
		if it == 0 {
			ready(who)
		}
	}
}

// runP2P starts an agent, swaps metadata with the other through files in
// dir, and writes a buffer into the other's region with a notification,
// in a loop, until a request fails.
func runP2P(ctx context.Context, name, peer, dir string, peerTimeout time.Duration, n int, ready func(string)) (string, func(), error) {
	who := "agent " + name
	a, err := p2p.New(name, p2p.Config{PeerTimeout: peerTimeout})
	if err != nil {
		return who, nil, err
	}
	closeFn := func() { a.Close() }
	buf, err := a.Alloc(n)
	if err != nil {
		return who, closeFn, err
	}
	tmp := filepath.Join(dir, name+".tmp")
	if err := os.WriteFile(tmp, a.LocalMetadata(), 0o600); err != nil {
		return who, closeFn, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name+".md")); err != nil {
		return who, closeFn, err
	}
	var blob []byte
	for {
		if blob, err = os.ReadFile(filepath.Join(dir, peer+".md")); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return who, closeFn, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := a.LoadRemote(ctx, blob); err != nil {
		return who, closeFn, err
	}
	regions, err := a.RemoteRegions(peer)
	if err != nil {
		return who, closeFn, err
	}
	if len(regions) == 0 {
		return who, closeFn, fmt.Errorf("%s published no region", peer)
	}
	local := p2p.DescList{Type: p2p.DRAM, Descs: []p2p.Desc{buf.Desc(0, uint64(n))}}
	remote := p2p.DescList{Type: p2p.DRAM, Descs: []p2p.Desc{regions[0].Desc(0, uint64(n))}}
	req, err := a.CreateRequest(p2p.Write, local, peer, remote, &p2p.RequestOptions{Notif: []byte("soak")})
	if err != nil {
		return who, closeFn, err
	}
	closeFn = func() { req.Release(); a.Close() }
	for it := 0; ; it++ {
		if _, err := req.Post(); err != nil {
			return who, closeFn, err
		}
		if err := req.Wait(ctx); err != nil {
			return who, closeFn, err
		}
		a.GetNotifs()
		if it == 0 {
			ready(who)
		}
	}
}
