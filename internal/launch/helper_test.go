//go:build unix

package launch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// helperArg makes the test binary act as a rank (or a launcher) instead of
// running tests: the tests start themselves as children.
const helperArg = "-launch-test-helper"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == helperArg {
		os.Exit(helperMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// helperMain runs a rank's script, one action per argument, in order. An
// action prefixed "R:" runs only on global rank R. Actions:
//
//	env          print the rank variables as NAME=VALUE lines
//	ready        print "ready <pid>"
//	ignore-term  ignore SIGTERM and SIGINT
//	sleep=D      sleep for duration D
//	exit=N       exit with status N
//	kill=N       kill itself with signal N
//	partial      print lines in pieces, on stdout and stderr, the last unfinished
//	spawn        start a grandchild that sleeps, print "grandchild <pid>"
//	spawn-print=D  start a grandchild sharing stdout that prints "late" after D
//	print=TEXT   print TEXT and a newline
//	shm=DIR      create DIR/gccl-$GCCL_JOB_ID-rank$GCCL_RANK
//	launcher     run a 2-rank job of "ready sleep=60s" (for the Pdeathsig test)
func helperMain(actions []string) int {
	rank := os.Getenv("GCCL_RANK")
	for _, action := range actions {
		if r, a, ok := strings.Cut(action, ":"); ok {
			if r != rank {
				continue
			}
			action = a
		}
		name, arg, _ := strings.Cut(action, "=")
		switch name {
		case "env":
			for _, v := range rankVariables {
				fmt.Printf("%s=%s\n", v, os.Getenv(v))
			}
		case "ready":
			fmt.Printf("ready %d\n", os.Getpid())
		case "ignore-term":
			signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
		case "sleep":
			d, err := time.ParseDuration(arg)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 99
			}
			time.Sleep(d)
		case "exit":
			n, _ := strconv.Atoi(arg)
			return n
		case "kill":
			n, _ := strconv.Atoi(arg)
			syscall.Kill(os.Getpid(), syscall.Signal(n))
			time.Sleep(time.Minute)
		case "partial":
			for _, piece := range []string{"par", "tial ", "line\nsec", "ond line\nunfin", "ished"} {
				os.Stdout.WriteString(piece)
				os.Stderr.WriteString("err " + piece)
				time.Sleep(5 * time.Millisecond)
			}
		case "spawn":
			cmd := exec.Command(os.Args[0], helperArg, "sleep=60s")
			if err := cmd.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 99
			}
			fmt.Printf("grandchild %d\n", cmd.Process.Pid)
		case "spawn-print":
			cmd := exec.Command(os.Args[0], helperArg, "sleep="+arg, "print=late")
			cmd.Stdout = os.Stdout
			if err := cmd.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 99
			}
			fmt.Printf("grandchild %d\n", cmd.Process.Pid)
		case "print":
			fmt.Println(arg)
		case "shm":
			path := filepath.Join(arg, ShmPrefix(os.Getenv("GCCL_JOB_ID"))+"rank"+rank)
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 99
			}
		case "launcher":
			job := &Job{NProcs: 2, Argv: []string{os.Args[0], helperArg, "ready", "sleep=60s"}, TagOutput: true}
			code, _ := job.Run(context.Background())
			return code
		default:
			fmt.Fprintf(os.Stderr, "unknown helper action %q\n", action)
			return 99
		}
	}
	return 0
}

// helperJob is a job of n ranks of the test binary running actions.
func helperJob(t *testing.T, n int, actions ...string) (*Job, *output) {
	t.Helper()
	out := &output{}
	job := &Job{
		NProcs:    n,
		Argv:      append([]string{os.Args[0], helperArg}, actions...),
		Env:       os.Environ(),
		TagOutput: true,
		Stdout:    out.stream("stdout"),
		Stderr:    out.stream("stderr"),
		ShmDir:    t.TempDir(),
	}
	return job, out
}

// output collects a job's stdout and stderr and lets a test wait for lines.
type output struct {
	mu      sync.Mutex
	streams map[string]*bytes.Buffer
	changed chan struct{}
}

type outputStream struct {
	o    *output
	name string
}

func (o *output) stream(name string) outputStream {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.streams == nil {
		o.streams = map[string]*bytes.Buffer{}
		o.changed = make(chan struct{}, 1)
	}
	o.streams[name] = &bytes.Buffer{}
	return outputStream{o, name}
}

func (s outputStream) Write(p []byte) (int, error) {
	s.o.mu.Lock()
	defer s.o.mu.Unlock()
	s.o.streams[s.name].Write(p)
	select {
	case s.o.changed <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (o *output) text(name string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.streams[name].String()
}

// waitCount waits until stdout holds n lines containing substr. Tests call
// it from goroutines, so it returns an error rather than failing the test.
func (o *output) waitCount(substr string, n int) error {
	deadline := time.After(20 * time.Second)
	for strings.Count(o.text("stdout"), substr) < n {
		select {
		case <-o.changed:
		case <-deadline:
			return fmt.Errorf("timed out waiting for %d lines with %q; stdout:\n%s", n, substr, o.text("stdout"))
		}
	}
	return nil
}

// pidsAfter returns the numbers that follow word in the stdout lines.
func (o *output) pidsAfter(word string) []int {
	var pids []int
	for _, line := range strings.Split(o.text("stdout"), "\n") {
		if _, rest, ok := strings.Cut(line, word+" "); ok {
			if pid, err := strconv.Atoi(rest); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// processGone reports whether pid has exited. A zombie counts as gone: an
// orphan's new parent may not reap it promptly (or at all, in containers).
func processGone(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X'
}

// waitGone waits up to 10 s for every pid to exit.
func waitGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for !processGone(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d is still running", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// runJob runs job and fails the test if it takes longer than limit, which
// is far below the 60 s the ranks would sleep if nobody stopped them.
func runJob(t *testing.T, job *Job, limit time.Duration) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	code, err := job.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("job was still running after %v (code %d, err %v)", limit, code, err)
	}
	return code, err
}
