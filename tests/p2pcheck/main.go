// Command p2pcheck moves data between two p2p agents in two processes (on
// two hosts, or two network namespaces) and checks every byte, for
// tests/netns_test.go. The target's metadata goes through a file both can
// read; the environment (GCCL_TLS, GCCL_SHM_DISABLE, ...) configures both.
//
//	p2pcheck target HOST FILE    serve a region; exit once it holds the initiator's data
//	p2pcheck initiator FILE      read the region, check it, write it, notify
//	p2pcheck stranger FILE       connect without loading the metadata (no token): must be refused
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/gccl/gccl/p2p"
)

const size = 6<<20 + 11

func pattern(seed byte) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>9)
	}
	return b
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	switch {
	case len(os.Args) == 4 && os.Args[1] == "target":
		err = target(ctx, os.Args[2], os.Args[3])
	case len(os.Args) == 3 && os.Args[1] == "initiator":
		err = initiator(ctx, os.Args[2])
	case len(os.Args) == 3 && os.Args[1] == "stranger":
		err = stranger(ctx, os.Args[2])
	default:
		err = fmt.Errorf("usage: p2pcheck target HOST FILE | initiator FILE | stranger FILE")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "p2pcheck %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func target(ctx context.Context, host, file string) error {
	a, err := p2p.New("target", p2p.Config{ListenAddr: net.JoinHostPort(host, "0"), RequireToken: true})
	if err != nil {
		return err
	}
	defer a.Close()
	r, err := a.RegisterMem(pattern(1))
	if err != nil {
		return err
	}
	// FILE: region address, length, agent address, then the metadata.
	blob := binary.LittleEndian.AppendUint64(nil, r.Addr())
	blob = binary.LittleEndian.AppendUint64(blob, size)
	blob = append(blob, byte(len(a.Addr())))
	blob = append(append(blob, a.Addr()...), a.LocalMetadata()...)
	if err := os.WriteFile(file+".tmp", blob, 0o600); err != nil {
		return err
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		return err
	}
	for {
		n, err := a.WaitNotifs(ctx)
		if err != nil {
			return err
		}
		if len(n["initiator"]) > 0 {
			break
		}
	}
	if !bytes.Equal(r.Bytes(), pattern(2)) {
		return fmt.Errorf("the region does not hold the initiator's data")
	}
	fmt.Println("p2pcheck: target ok")
	return nil
}

func readFile(ctx context.Context, file string) (base uint64, addr string, md []byte, err error) {
	for {
		b, err := os.ReadFile(file)
		if err == nil {
			n := int(b[16])
			return binary.LittleEndian.Uint64(b), string(b[17 : 17+n]), b[17+n:], nil
		}
		select {
		case <-ctx.Done():
			return 0, "", nil, fmt.Errorf("waiting for %s: %w", file, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func initiator(ctx context.Context, file string) error {
	base, _, md, err := readFile(ctx, file)
	if err != nil {
		return err
	}
	a, err := p2p.New("initiator", p2p.Config{ListenAddr: "-"})
	if err != nil {
		return err
	}
	defer a.Close()
	name, err := a.LoadRemote(ctx, md)
	if err != nil {
		return err
	}
	buf := make([]byte, size)
	lr, err := a.RegisterMem(buf)
	if err != nil {
		return err
	}
	local := p2p.DescList{Type: p2p.DRAM, Descs: []p2p.Desc{lr.Desc(0, size)}}
	remote := p2p.DescList{Type: p2p.DRAM, Descs: []p2p.Desc{{Addr: base, Len: size}}}
	run := func(op p2p.Op, opts *p2p.RequestOptions) error {
		req, err := a.CreateRequest(op, local, name, remote, opts)
		if err != nil {
			return err
		}
		defer req.Release()
		fmt.Printf("p2pcheck: %v over %v\n", op, req.Backend())
		if _, err := req.Post(); err != nil {
			return err
		}
		return req.Wait(ctx)
	}
	if err := run(p2p.Read, nil); err != nil {
		return err
	}
	if !bytes.Equal(buf, pattern(1)) {
		return fmt.Errorf("read data differs")
	}
	copy(buf, pattern(2))
	if err := run(p2p.Write, &p2p.RequestOptions{Notif: []byte("done")}); err != nil {
		return err
	}
	fmt.Println("p2pcheck: initiator ok")
	return nil
}

func stranger(ctx context.Context, file string) error {
	_, addr, _, err := readFile(ctx, file)
	if err != nil {
		return err
	}
	a, err := p2p.New("stranger", p2p.Config{ListenAddr: "-"})
	if err != nil {
		return err
	}
	defer a.Close()
	if _, err := a.Connect(ctx, addr); err != nil {
		fmt.Printf("p2pcheck: stranger refused: %v\n", err)
		return nil
	}
	return fmt.Errorf("the target admitted an agent that did not load its metadata")
}
