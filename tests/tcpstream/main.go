// Command tcpstream is the plain-Go reference for one-way TCP streams
// between two processes on one host (docs/PERFORMANCE.md, "Sockets per
// pair"): a second process writes -n messages of -size bytes over -s
// loopback sockets, each message cut into one equal part per socket, and
// this one reads them with io.ReadFull, socket by socket; nothing goes
// back. It prints µs per message and GB/s: what a one-way stream costs a Go
// program with one socket or several, without gccl's framing and progress.
// With -poll the reader polls instead, as a gccl rank waiting for a message
// does: non-blocking reads of every socket whose part is not complete yet,
// round after round, never sleeping.
//
//	go run ./tests/tcpstream -s 2 -size 1048576 -n 3000 [-poll]
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"time"
)

const warmup = 50

func main() {
	socks := flag.Int("s", 1, "sockets; each message is cut into one part per socket")
	size := flag.Int("size", 1<<20, "bytes per message")
	n := flag.Int("n", 3000, "messages timed (after 50 untimed)")
	poll := flag.Bool("poll", false, "read by polling non-blocking sockets instead of blocking reads")
	serve := flag.String("serve", "", "internal: stream to the process listening at this address")
	flag.Parse()
	if *socks < 1 || *socks > 64 || *size < *socks || *n < 1 {
		fmt.Fprintln(os.Stderr, "tcpstream: want -s from 1 to 64, -size at least -s and -n at least 1")
		os.Exit(2)
	}
	var err error
	if *serve != "" {
		err = stream(*serve, *socks, *size, *n+warmup)
	} else {
		err = run(*socks, *size, *n, *poll)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tcpstream:", err)
		os.Exit(1)
	}
}

// part is socket i's share of a message of size bytes over socks sockets.
func part(b []byte, socks, i int) []byte {
	return b[len(b)*i/socks : len(b)*(i+1)/socks]
}

func stream(addr string, socks, size, count int) error {
	conns := make([]net.Conn, socks)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		conns[i] = c
	}
	buf := make([]byte, size)
	for range count {
		for i, c := range conns {
			if _, err := c.Write(part(buf, socks, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func run(socks, size, n int, poll bool) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-serve", ln.Addr().String(), "-s", fmt.Sprint(socks), "-size", fmt.Sprint(size), "-n", fmt.Sprint(n))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer cmd.Wait()
	conns := make([]net.Conn, socks)
	for i := range conns {
		c, err := ln.Accept()
		if err != nil {
			cmd.Process.Kill()
			return err
		}
		defer c.Close()
		conns[i] = c
	}
	read := func(buf []byte) error {
		for i, c := range conns {
			if _, err := io.ReadFull(c, part(buf, socks, i)); err != nil {
				return err
			}
		}
		return nil
	}
	how := "blocking reads"
	if poll {
		fds, err := nonblocking(conns)
		if err != nil {
			return err
		}
		read = func(buf []byte) error { return pollParts(fds, buf) }
		how = "polling"
	}
	buf := make([]byte, size)
	var start time.Time
	for k := range n + warmup {
		if k == warmup {
			start = time.Now()
		}
		if err := read(buf); err != nil {
			return err
		}
	}
	el := time.Since(start)
	fmt.Printf("sockets %d, size %d, %s: %.1f µs per message, %.2f GB/s\n", socks, size, how, el.Seconds()/float64(n)*1e6, float64(size)*float64(n)/el.Seconds()/1e9)
	return nil
}
