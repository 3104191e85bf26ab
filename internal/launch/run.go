package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Errors that end a job besides a failing rank.
var (
	ErrTimeout     = errors.New("launch: job timed out")
	ErrInterrupted = errors.New("launch: job interrupted")
	// ErrBrokenPipe means the reader of Stdout or Stderr went away (gccl-run
	// ... | head -1): the job is stopped as SIGPIPE would stop a program
	// writing there itself.
	ErrBrokenPipe = errors.New("launch: job stopped: its output was closed (broken pipe)")
)

const (
	// outputDrainDelay bounds how long Run keeps reading the ranks' output
	// after the job ended, when a process that left the ranks' process
	// groups (and so was not stopped) still holds a pipe open.
	outputDrainDelay = time.Second
	// groupPollInterval is how often Run checks, while stopping a job,
	// whether the ranks' process groups have emptied.
	groupPollInterval = 20 * time.Millisecond
)

// RankError is the first failure of a rank, the one that decided the job's
// exit code.
type RankError struct {
	Rank      int            // global rank
	LocalRank int            // rank on this node
	PID       int            // process ID
	ExitCode  int            // exit status; -1 when killed by a signal
	Signal    syscall.Signal // the signal that killed the rank, or 0
}

func (e *RankError) Error() string {
	if e.Signal != 0 {
		return fmt.Sprintf("rank %d (pid %d) was killed by signal %d (%v)", e.Rank, e.PID, int(e.Signal), e.Signal)
	}
	return fmt.Sprintf("rank %d (pid %d) exited with status %d", e.Rank, e.PID, e.ExitCode)
}

// Code is the exit code that the failure gives the job, as a shell would
// report it: the rank's exit status, or 128+signal.
func (e *RankError) Code() int {
	if e.Signal != 0 {
		return exitSignalBase + int(e.Signal)
	}
	return e.ExitCode
}

// Run starts the job's NProcs local ranks and waits for them. It returns 0
// and a nil error when every rank exits 0. Otherwise the first failure
// stops the others (SIGTERM to each rank's process group, SIGKILL after
// KillGrace; with KeepGoing a failed rank stops no one, and the result
// waits for every rank to end) and decides the result:
//
//   - a rank exits with status s, or is killed by signal g: s or 128+g,
//     and a *RankError;
//   - Timeout expires: 124 (ExitTimeout) and ErrTimeout;
//   - a signal g arrives on Signals: it is forwarded to every rank, and
//     the result is 128+g and ErrInterrupted;
//   - ctx is done: 124 for a deadline, else 1, with ctx's error;
//   - writing to Stdout or Stderr fails with EPIPE (its reader is gone):
//     141 (128+SIGPIPE) and ErrBrokenPipe;
//   - the program cannot be started: 127 (not found), 126 (not
//     executable) or 1.
//
// When every rank has exited, processes they left in their process groups
// (a helper started with "cmd &") are stopped the same way, as Slurm does
// at the end of a step, so nothing of the job outlives Run.
//
// Ranks read standard input from /dev/null. Their output lines go to
// Stdout and Stderr, tagged "[rank R] " when TagOutput is set; lines from
// different ranks never mix, except lines longer than 1 MiB (see
// lineTagger). Output of processes a rank started is read until the whole
// job ends, plus a grace of a second for those that escaped the process
// group. When all ranks are gone, Run removes the job's leftover
// shared-memory segments (gccl-<JobID>-* in ShmDir).
//
// On Linux a rank also dies if the launcher itself is killed (Pdeathsig),
// so ranks never outlive it; call Run from an ordinary goroutine, not one
// locked to its thread that exits while the job runs.
//
// Run calls Resolve first, so afterwards the Job shows the port, secret and
// job ID it used.
func (j *Job) Run(ctx context.Context) (exitCode int, err error) {
	if err := j.Resolve(); err != nil {
		return ExitFailure, err
	}
	// One lookup for all ranks, before starting any, so that a typo fails
	// at once with the shell's exit code.
	path, err := exec.LookPath(j.Argv[0])
	if err != nil {
		return startFailureCode(err), fmt.Errorf("launch: %w", err)
	}
	s := &supervisor{job: j, log: j.logger(), broken: make(chan struct{}, 1)}
	exitCode, err = s.run(ctx, path)
	if !j.Join { // newcomers' segments belong to the running job
		j.removeShm(s.log)
	}
	return exitCode, err
}

// rankProc is one started rank.
type rankProc struct {
	rank, localRank int
	cmd             *exec.Cmd
}

// rankExit is what waiting for a rank returned.
type rankExit struct {
	proc    *rankProc
	waitErr error
}

// supervisor runs one job: it starts the ranks, watches them, and applies
// the stop policy. All its state is owned by the goroutine in run, except
// the output copiers' channels.
type supervisor struct {
	job   *Job
	log   *slog.Logger
	procs []*rankProc
	exits chan rankExit

	// Output copiers, one per stream of each rank: readers are the read
	// ends of the ranks' pipes, copying counts the copiers still running,
	// and broken receives a value when one found the destination's reader
	// gone (EPIPE).
	readers []*os.File
	copying sync.WaitGroup
	broken  chan struct{}

	// The job's result, once decided by its first failure.
	failed bool
	code   int
	err    error

	stopping bool        // the ranks were told to stop (SIGTERM or a forwarded signal)
	killed   bool        // the ranks were sent SIGKILL
	grace    *time.Timer // runs from the stop to SIGKILL
}

func (s *supervisor) run(ctx context.Context, path string) (int, error) {
	j := s.job
	s.exits = make(chan rankExit, j.NProcs)
	var outputMu sync.Mutex
	stdout := lockedWriter{&outputMu, writerOr(j.Stdout, os.Stdout)}
	stderr := lockedWriter{&outputMu, writerOr(j.Stderr, os.Stderr)}
	for local := range j.NProcs {
		p, err := s.start(path, local, stdout, stderr)
		if err != nil {
			s.fail(startFailureCode(err), fmt.Errorf("launch: starting rank %d: %w", j.GlobalRank(local), err))
			break
		}
		s.procs = append(s.procs, p)
		go func() { s.exits <- rankExit{p, p.cmd.Wait()} }()
	}
	s.supervise(ctx)
	if s.grace != nil {
		s.grace.Stop()
	}
	s.drainOutput()
	if s.pipeBroken() {
		// Also when the ranks were done: output was lost, as for a
		// program killed by SIGPIPE.
		s.record(exitSignalBase+int(syscall.SIGPIPE), ErrBrokenPipe)
	}
	if !s.failed {
		return 0, nil
	}
	return s.code, s.err
}

func (s *supervisor) start(path string, local int, stdout, stderr io.Writer) (*rankProc, error) {
	j := s.job
	p := &rankProc{rank: j.GlobalRank(local), localRank: local}
	prefix := ""
	if j.TagOutput {
		prefix = fmt.Sprintf("[rank %d] ", p.rank)
		if j.Join { // the rendezvous numbers newcomers
			prefix = fmt.Sprintf("[join %d] ", local)
		}
	}
	// The ranks write to pipes of our own rather than through os/exec's
	// copying, whose Wait ends the copy a fixed delay after the rank exits:
	// here the output of what a rank started is read while the job lasts.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	p.cmd = &exec.Cmd{
		Path:        path,
		Args:        j.Argv,
		Env:         j.RankEnv(local),
		Stdout:      outW,
		Stderr:      errW,
		SysProcAttr: rankProcAttr(),
	}
	err = p.cmd.Start()
	// The rank has its own copies of the write ends; ours would keep the
	// pipes open after every writer is gone.
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, err
	}
	s.copyOutput(p, outR, newLineTagger(stdout, prefix))
	s.copyOutput(p, errR, newLineTagger(stderr, prefix))
	s.log.Debug("started rank", "rank", p.rank, "local_rank", local, "pid", p.cmd.Process.Pid)
	return p, nil
}

// copyOutput copies one of p's streams from r through t until every
// process holding the pipe's write end has closed it, or drainOutput stops
// it. When the destination fails, r is closed, so that the writers get
// EPIPE (or SIGPIPE) as they would writing to the destination directly.
func (s *supervisor) copyOutput(p *rankProc, r *os.File, t *lineTagger) {
	s.readers = append(s.readers, r)
	s.copying.Go(func() {
		defer r.Close()
		// The copy ends at EOF, when drainOutput stops it, or when t's
		// destination fails; only then is there nothing to flush.
		io.Copy(t, r)
		err := t.err
		if err == nil {
			err = t.Close()
		}
		if err == nil {
			return
		}
		if errors.Is(err, syscall.EPIPE) {
			select {
			case s.broken <- struct{}{}:
			default:
			}
		}
		s.log.Debug("writing rank output", "rank", p.rank, "err", err)
	})
}

// drainOutput waits for the output copiers to finish, which they do once
// every process holding a rank's pipe is gone. Processes that left the
// ranks' process groups survive the job's end; their output is read for
// outputDrainDelay more, then dropped.
func (s *supervisor) drainOutput() {
	done := make(chan struct{})
	go func() {
		s.copying.Wait()
		close(done)
	}()
	t := time.NewTimer(outputDrainDelay)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	s.log.Debug("a process that left the job still holds a rank's output open; dropping its output")
	for _, r := range s.readers {
		// Ends a blocked Read; where pipes have no deadlines, closing
		// does. Either way the copier flushes what it has.
		if r.SetReadDeadline(time.Now()) != nil {
			r.Close()
		}
	}
	<-done
}

// pipeBroken reports whether an output copier found the destination's
// reader gone.
func (s *supervisor) pipeBroken() bool {
	select {
	case <-s.broken:
		return true
	default:
		return false
	}
}

// supervise waits until every rank has exited and their process groups
// are empty, stopping what is left of the groups (SIGTERM, then SIGKILL
// after the grace period) once the ranks are gone.
func (s *supervisor) supervise(ctx context.Context) {
	j := s.job
	var timeout <-chan time.Time
	if j.Timeout > 0 {
		t := time.NewTimer(j.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	signals := j.Signals
	done := ctx.Done()
	broken := s.broken
	var poll <-chan time.Time
	for running := len(s.procs); ; {
		if running == 0 {
			if !s.stopping && s.anyGroupAlive() {
				// Every rank is done, but processes they started
				// linger: the job is over, so they stop too.
				s.log.Debug("the ranks have exited; stopping what is left of their process groups")
				s.stop(syscall.SIGTERM)
			}
			if s.killed || !s.anyGroupAlive() {
				return
			}
			// Give what is left the rest of the grace period.
			if poll == nil {
				ticker := time.NewTicker(groupPollInterval)
				defer ticker.Stop()
				poll = ticker.C
			}
		}
		var graceOver <-chan time.Time
		if s.grace != nil && !s.killed {
			graceOver = s.grace.C
		}
		select {
		case e := <-s.exits:
			running--
			// A rank killed by SIGPIPE after its output could not be
			// written died of the broken pipe, which decides the result.
			// The copier reported it before closing the rank's pipe.
			if broken != nil && s.pipeBroken() {
				broken = nil
				s.fail(exitSignalBase+int(syscall.SIGPIPE), ErrBrokenPipe)
			}
			s.reap(e)
		case <-broken:
			broken = nil
			s.fail(exitSignalBase+int(syscall.SIGPIPE), ErrBrokenPipe)
		case <-timeout:
			timeout = nil
			s.fail(ExitTimeout, fmt.Errorf("%w after %v", ErrTimeout, j.Timeout))
		case sig, ok := <-signals:
			if !ok {
				signals = nil
				continue
			}
			s.forward(sig)
		case <-done:
			done = nil
			code := ExitFailure
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				code = ExitTimeout
			}
			s.fail(code, fmt.Errorf("launch: job stopped: %w", context.Cause(ctx)))
		case <-graceOver:
			s.killAll()
		case <-poll:
		}
	}
}

// reap records a rank's exit. The first failure stops the job; later ones
// are usually the ranks it stopped.
func (s *supervisor) reap(e rankExit) {
	p := e.proc
	var exitErr *exec.ExitError
	if e.waitErr != nil && !errors.As(e.waitErr, &exitErr) {
		s.log.Debug("waiting for rank", "rank", p.rank, "err", e.waitErr)
	}
	state := p.cmd.ProcessState
	if state == nil {
		s.fail(ExitFailure, fmt.Errorf("launch: waiting for rank %d: %w", p.rank, e.waitErr))
		return
	}
	rerr := &RankError{Rank: p.rank, LocalRank: p.localRank, PID: state.Pid(), ExitCode: state.ExitCode()}
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		rerr.Signal = ws.Signal()
	}
	if rerr.Code() == 0 {
		s.log.Debug("rank exited", "rank", p.rank, "status", 0)
		return
	}
	if s.stopping {
		s.log.Debug("rank stopped", "rank", p.rank, "how", rerr.Error())
		return
	}
	if s.job.KeepGoing {
		s.log.Warn("rank failed; the others go on (keep going)", "rank", p.rank, "how", rerr.Error())
		s.record(rerr.Code(), rerr)
		return
	}
	s.log.Debug("rank failed; stopping the job", "rank", p.rank, "how", rerr.Error())
	s.fail(rerr.Code(), rerr)
}

// fail records the job's result if none is recorded yet, then stops the
// ranks politely.
func (s *supervisor) fail(code int, err error) {
	s.record(code, err)
	if !s.stopping {
		s.stop(syscall.SIGTERM)
	}
}

// stop sends sig to the ranks' process groups and starts the grace period,
// after which SIGKILL follows.
func (s *supervisor) stop(sig syscall.Signal) {
	s.stopping = true
	s.signalAll(sig)
	s.startGrace()
}

func (s *supervisor) record(code int, err error) {
	if !s.failed {
		s.failed, s.code, s.err = true, code, err
	}
}

// forward passes a signal the launcher received to every rank, and counts
// it as the job's end: ranks get the grace period to exit. A signal while
// the job is already stopping (a second Ctrl-C) kills the ranks at once.
func (s *supervisor) forward(sig os.Signal) {
	ssig, ok := sig.(syscall.Signal)
	if s.stopping || !ok {
		s.log.Debug("signal while stopping; killing the ranks", "signal", sig)
		s.killAll()
		return
	}
	s.log.Debug("forwarding signal to the ranks", "signal", sig)
	s.record(exitSignalBase+int(ssig), fmt.Errorf("%w by signal %d (%v)", ErrInterrupted, int(ssig), ssig))
	s.stop(ssig)
}

func (s *supervisor) startGrace() {
	switch {
	case s.job.KillGrace < 0: // NoKillGrace
		s.killAll()
	case s.grace == nil:
		s.grace = time.NewTimer(s.job.KillGrace)
	}
}

func (s *supervisor) killAll() {
	if s.killed {
		return
	}
	s.killed = true
	s.log.Debug("killing what is left of the ranks", "signal", syscall.SIGKILL)
	s.signalAll(syscall.SIGKILL)
}

// signalAll signals every rank's process group, those of ranks that
// already exited too: their descendants may still be running. (A group is
// named by its leader's pid; after the leader was reaped and every member
// exited, the number could in principle be reused within the grace period.
// The kernel rarely reuses pids that soon, and the cost of not stopping
// descendants is higher.)
func (s *supervisor) signalAll(sig syscall.Signal) {
	for _, p := range s.procs {
		if err := signalGroup(p.cmd.Process.Pid, sig); err != nil {
			s.log.Debug("signaling rank", "rank", p.rank, "signal", sig, "err", err)
		}
	}
}

func (s *supervisor) anyGroupAlive() bool {
	for _, p := range s.procs {
		if groupAlive(p.cmd.Process.Pid) {
			return true
		}
	}
	return false
}

// removeShm removes the job's leftover shared-memory segments.
func (j *Job) removeShm(log *slog.Logger) {
	dir := j.ShmDir
	if dir == "" {
		dir = DefaultShmDir
	}
	n, err := RemoveShmSegments(dir, j.JobID)
	if err != nil {
		log.Warn("removing the job's shared-memory segments", "dir", dir, "job_id", j.JobID, "err", err)
	}
	log.Debug("removed leftover shared-memory segments", "count", n, "dir", dir, "job_id", j.JobID)
}

// startFailureCode maps a failure to start the program to the shell's exit
// codes: 126 for a file that exists but cannot be executed (no permission,
// a directory, not a binary the kernel can run), as bash reports them.
func startFailureCode(err error) int {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return ExitNotFound
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOEXEC):
		return ExitNotExecutable
	}
	return ExitFailure
}

func writerOr(w, def io.Writer) io.Writer {
	if w == nil {
		return def
	}
	return w
}
