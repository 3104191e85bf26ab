package bootstrap

import (
	"fmt"
	"net"
	"os"
	"strings"
)

// NewcomerFromEnv returns the Config of a process that joins a running job
// as a newcomer (JoinGrow) from the environment: GCCL_BOOTSTRAP_ADDR (the
// job's rendezvous, host:port) and GCCL_SECRET (the job's secret) are
// required; GCCL_RANK and GCCL_SIZE, optional, are the rank asked for in
// the grown group and its size (default AnyRank, and 0: the open Grow's);
// GCCL_LOCAL_RANK, GCCL_LOCAL_SIZE, GCCL_JOB_ID, GCCL_TLS and its files,
// GCCL_BOOTSTRAP_TIMEOUT and GCCL_HEARTBEAT_TIMEOUT mean what they mean to
// FromEnv. gccl-run --join
// sets them.
func NewcomerFromEnv() (Config, error) { return newcomerFromEnv(os.LookupEnv) }

func newcomerFromEnv(lookup func(string) (string, bool)) (Config, error) {
	e := env(lookup)
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("gccl bootstrap: newcomer: %w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	cfg := Config{Rank: AnyRank}
	for _, v := range []struct {
		name string
		to   *int
	}{{"GCCL_RANK", &cfg.Rank}, {"GCCL_SIZE", &cfg.Size}, {"GCCL_LOCAL_RANK", &cfg.LocalRank}, {"GCCL_LOCAL_SIZE", &cfg.LocalSize}} {
		n, ok, err := e.int(v.name)
		if err != nil {
			return Config{}, err
		}
		if ok {
			*v.to = n
		}
	}
	addr, ok := e.str("GCCL_BOOTSTRAP_ADDR")
	if !ok {
		return bad("GCCL_BOOTSTRAP_ADDR is not set: a newcomer dials the running job's rendezvous (host:port of rank 0 or gccl-bootstrap)")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return bad("GCCL_BOOTSTRAP_ADDR=%q is not host:port", addr)
	}
	cfg.Addr = addr
	secret, ok := e.str("GCCL_SECRET")
	if !ok {
		return bad("GCCL_SECRET is not set: the rendezvous admits only holders of the job's secret; give the newcomer the job's GCCL_SECRET")
	}
	cfg.Secret = strings.ToLower(secret)
	if err := checkSecret(cfg.Secret); err != nil {
		return Config{}, fmt.Errorf("gccl bootstrap: GCCL_SECRET: %w", err)
	}
	if err := e.jobAndTLS(&cfg); err != nil {
		return bad("%v", err)
	}
	if err := e.timeouts(&cfg); err != nil {
		return bad("%v", err)
	}
	return cfg, nil
}
