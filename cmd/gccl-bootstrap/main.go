// Command gccl-bootstrap serves the rendezvous of one gccl job standalone,
// for jobs too large for rank 0 to serve in-process:
//
//	GCCL_SECRET=$(openssl rand -hex 16) gccl-bootstrap --addr :29500 --size 1024
//
// The ranks then run with the same GCCL_SECRET, GCCL_BOOTSTRAP_ADDR=host:29500
// and GCCL_BOOTSTRAP_SERVE=0. It logs joins, losses and aborts (GCCL_DEBUG
// sets the level, INFO by default) and exits when every rank has left or
// been lost, or on SIGTERM or SIGINT: 0 if the job ended cleanly or was
// stopped, 1 if a rank was lost or aborted, 2 for bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gccl/gccl/bootstrap"
	"github.com/gccl/gccl/internal/logx"
)

const usage = `Usage: gccl-bootstrap --size N [--addr host:port] [--secret-file path]

Serves the rendezvous of one gccl job of N ranks. The job secret (32 hex
characters) comes from --secret-file or GCCL_SECRET; it is never taken on the
command line, where other users could read it in the process list.

Flags:
`

// maxSize bounds --size, as gccl-run bounds a job (launch.MaxWorldSize):
// the rendezvous's all-gather answers hold a descriptor of every rank and
// are capped at 256 MiB, so beyond 2^20 ranks each could contribute less
// than 256 bytes. Without a bound a typo would exhaust memory before the
// server started.
const maxSize = 1 << 20

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil))
}

// run is the whole command; ready, if not nil, is called with the address
// once the server listens.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready func(addr string)) int {
	flags := flag.NewFlagSet("gccl-bootstrap", flag.ContinueOnError)
	flags.SetOutput(stderr)
	flags.Usage = func() {
		fmt.Fprint(stderr, usage)
		flags.PrintDefaults()
	}
	addr := flags.String("addr", fmt.Sprintf(":%d", bootstrap.DefaultPort), "address to listen on")
	size := flags.Int("size", 0, fmt.Sprintf("number of ranks in the job (required; at most %d)", maxSize))
	secretFile := flags.String("secret-file", "", "file holding the job secret (default: $GCCL_SECRET)")
	heartbeat := flags.Duration("heartbeat-timeout", bootstrap.DefaultHeartbeatTimeout, "declare a rank lost after this much silence")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "gccl-bootstrap: "+format+"\n", args...)
		return 2
	}
	if flags.NArg() > 0 {
		return fail("unexpected arguments %q; see --help", flags.Args())
	}
	if *size < 1 {
		return fail("--size N is required (the number of ranks in the job)")
	}
	if *size > maxSize {
		return fail("--size %d is more than the %d ranks a gccl job supports", *size, maxSize)
	}
	secret := getenv("GCCL_SECRET")
	if *secretFile != "" {
		b, err := os.ReadFile(*secretFile)
		if err != nil {
			return fail("reading the secret: %v", err)
		}
		secret = string(b)
	}
	secret = strings.TrimSpace(secret)
	if secret == "" {
		return fail("no job secret: set GCCL_SECRET (e.g. export GCCL_SECRET=$(openssl rand -hex 16)) or pass --secret-file, and give the ranks the same secret")
	}

	level := getenv("GCCL_DEBUG")
	if level == "" {
		level = "INFO"
	}
	log := logx.New(stderr, level, getenv("GCCL_DEBUG_SUBSYS")).With("subsys", "BOOTSTRAP")
	opts := []bootstrap.ServerOption{bootstrap.WithLogger(log), bootstrap.WithHeartbeatTimeout(*heartbeat)}
	switch getenv("GCCL_TLS") { // as the ranks read it
	case "", "0":
	case "1":
		opts = append(opts, bootstrap.WithTLS(bootstrap.TLSFiles{Cert: getenv("GCCL_TLS_CERT"), Key: getenv("GCCL_TLS_KEY"), CA: getenv("GCCL_TLS_CA")}))
	default:
		return fail("GCCL_TLS=%q: want 0 or 1", getenv("GCCL_TLS"))
	}
	srv, err := bootstrap.NewServer(*addr, secret, *size, opts...)
	if err != nil {
		return fail("%v", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	log.Info(fmt.Sprintf("gccl-bootstrap %s serving a job of %d ranks on %s (job %s)", bootstrap.Version, *size, srv.Addr(), bootstrap.DeriveJobID(strings.ToLower(secret))))
	if ready != nil {
		ready(srv.Addr())
	}

	start := time.Now()
	select {
	case <-srv.Done():
	case <-ctx.Done():
		log.Info("stopping on signal")
	case err := <-served:
		fmt.Fprintf(stderr, "gccl-bootstrap: %v\n", err)
		srv.Stop()
		return 1
	}
	srv.Stop()
	<-served
	if err := srv.Err(); err != nil {
		log.Warn(fmt.Sprintf("job ended after %v: %v", time.Since(start).Round(time.Millisecond), err))
		return 1
	}
	if ctx.Err() == nil {
		log.Info(fmt.Sprintf("job ended after %v: every rank left", time.Since(start).Round(time.Millisecond)))
	}
	return 0
}
