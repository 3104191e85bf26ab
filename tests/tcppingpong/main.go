// Command tcppingpong is the plain-Go reference for the tcp backend's
// one-request-in-flight figures (docs/P2P.md): a second process reads
// each request of -size bytes over loopback TCP with io.ReadFull and
// answers one byte; the first writes a request and waits for the byte,
// -n times, and prints GB/s and µs per request. No framing, no
// registration, no notifications: what a Go program pays for the round
// trip and the copies alone on this machine.
//
//	go run ./tests/tcppingpong -size 1048576 -n 3000
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

func main() {
	size := flag.Int("size", 1<<20, "bytes per request")
	n := flag.Int("n", 3000, "requests timed (after 50 untimed)")
	serve := flag.String("serve", "", "internal: answer the requests of the process listening at this address")
	flag.Parse()
	if *size < 1 || *n < 1 {
		fmt.Fprintln(os.Stderr, "tcppingpong: -size and -n must be at least 1")
		os.Exit(2)
	}
	if *serve != "" {
		if err := answer(*serve, *size); err != nil {
			fmt.Fprintln(os.Stderr, "tcppingpong: answering:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*size, *n); err != nil {
		fmt.Fprintln(os.Stderr, "tcppingpong:", err)
		os.Exit(1)
	}
}

func answer(addr string, size int) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	buf, ack := make([]byte, size), []byte{1}
	for {
		if _, err := io.ReadFull(c, buf); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if _, err := c.Write(ack); err != nil {
			return err
		}
	}
}

func run(size, n int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-serve", ln.Addr().String(), "-size", fmt.Sprint(size))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer cmd.Wait()
	c, err := ln.Accept()
	if err != nil {
		cmd.Process.Kill()
		return err
	}
	defer c.Close()
	data, ack := make([]byte, size), make([]byte, 1)
	round := func() error {
		if _, err := c.Write(data); err != nil {
			return err
		}
		_, err := io.ReadFull(c, ack)
		return err
	}
	for range 50 {
		if err := round(); err != nil {
			return err
		}
	}
	start := time.Now()
	for range n {
		if err := round(); err != nil {
			return err
		}
	}
	el := time.Since(start)
	fmt.Printf("size %d: %.2f GB/s, %.1f µs per request\n", size, float64(size)*float64(n)/el.Seconds()/1e9, el.Seconds()/float64(n)*1e6)
	return nil
}
