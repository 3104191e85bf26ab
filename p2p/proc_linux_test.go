package p2p

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childProc is the parent's view of the child.
type childProc struct {
	cmd   *exec.Cmd
	lines chan string
	name  string
	pid   int
	md    []byte
}

func startChild(t testing.TB, size int, env ...string) *childProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{childEnv + "=1", "P2P_TEST_SIZE=" + strconv.Itoa(size)}, env...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &childProc{cmd: cmd, lines: make(chan string, 1024), pid: cmd.Process.Pid}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
		// A child killed while its peers had only found it silent (never
		// dead) keeps its segments: no survivor reaps them. Remove them as
		// a launcher would, so tests leave /dev/shm as they found it.
		if info, err := decodeMetadata(c.md); err == nil {
			for _, r := range info.Regions {
				if r.Flags&regionSHM != 0 {
					removeSegment(r.SHM)
				}
			}
		}
	})
	line := c.next(t)
	hexMD, ok := strings.CutPrefix(line, "MD ")
	if !ok {
		t.Fatalf("child said %q", line)
	}
	if c.md, err = hex.DecodeString(hexMD); err != nil {
		t.Fatal(err)
	}
	return c
}

// stop stops the child (SIGSTOP) and waits until it is stopped: the signal
// is asynchronous.
func (c *childProc) stop(t testing.TB) {
	t.Helper()
	c.cmd.Process.Signal(syscall.SIGSTOP)
	waitFor(t, func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(c.pid) + "/stat")
		i := bytes.LastIndexByte(b, ')')
		return err == nil && i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't')
	})
}

func (c *childProc) next(t testing.TB) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatal("child exited")
		}
		return l
	case <-time.After(15 * time.Second):
		t.Fatal("child silent for 15 s")
	}
	return ""
}

// childRegion is the child's one region, from its metadata.
func childRegion(t testing.TB, md []byte) regionInfo {
	info, err := decodeMetadata(md)
	if err != nil || len(info.Regions) != 1 {
		t.Fatalf("child metadata: %v", err)
	}
	return info.Regions[0]
}

func TestTwoProcesses(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		env  []string
		want Backend
	}{
		{"shm", Config{}, nil, BackendSHM},
		{"pvm", Config{}, []string{"P2P_TEST_HEAP=1"}, BackendPVM},
		{"tcp", Config{DisableSHM: true, DisablePVM: true}, []string{"GCCL_SHM_DISABLE=1"}, BackendTCP},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == BackendPVM {
				skipWithoutPVM(t)
			}
			const size = 4<<20 + 4096
			c := startChild(t, size, tc.env...)
			a := newAgent(t, "parent", tc.cfg)
			name, err := a.LoadRemote(ctxT(t), c.md)
			if err != nil || name != "child" {
				t.Fatalf("LoadRemote: %q, %v", name, err)
			}
			cr := childRegion(t, c.md)
			src := make([]byte, size)
			lr, _ := a.RegisterMem(src)

			// READ the child's initial pattern.
			rd, err := a.CreateRequest(Read, DescList{Type: DRAM, Descs: []Desc{{Addr: lr.Addr(), Len: size}}}, "child",
				DescList{Type: DRAM, Descs: []Desc{{Addr: cr.Base, Len: size}}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rd.Backend() != tc.want {
				t.Fatalf("backend %v, want %v", rd.Backend(), tc.want)
			}
			rd.Post()
			if err := rd.Wait(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, size)
			fill(want, childSeed)
			if !bytes.Equal(src, want) {
				t.Fatal("READ returned wrong bytes")
			}

			// WRITE many small descriptors (every other 4 KiB block) with a
			// notification the child answers after checking the data.
			var ld, rdsc []Desc
			for off := uint64(0); off+4096 <= 1<<20; off += 8192 {
				ld = append(ld, Desc{Addr: lr.Addr() + off, Len: 4096})
				rdsc = append(rdsc, Desc{Addr: cr.Base + off, Len: 4096})
			}
			fill(src[:4096], 3)
			for i := 1; i < len(ld); i++ {
				copy(src[i*8192:i*8192+4096], src[:4096])
			}
			wr, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: ld}, "child", DescList{Type: DRAM, Descs: rdsc},
				&RequestOptions{Notif: []byte("check 3 8192 4096 small")})
			if err != nil {
				t.Fatal(err)
			}
			wr.Post()
			if err := wr.Wait(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			if l := c.next(t); l != "OK small" {
				t.Fatalf("child: %q", l)
			}

			// One large WRITE, then exit.
			fill(src, 7)
			big, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{{Addr: lr.Addr(), Len: size}}}, "child",
				DescList{Type: DRAM, Descs: []Desc{{Addr: cr.Base, Len: size}}},
				&RequestOptions{Notif: []byte(fmt.Sprintf("check 7 0 %d big", size))})
			if err != nil {
				t.Fatal(err)
			}
			big.Post()
			if err := big.Wait(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			if l := c.next(t); l != "OK big" {
				t.Fatalf("child: %q", l)
			}
			rd.Release()
			wr.Release()
			big.Release()
			exitChild(t, a, c)
		})
	}
}

func exitChild(t testing.TB, a *Agent, c *childProc) {
	t.Helper()
	r, err := a.CreateRequest(Write, DescList{Type: DRAM}, "child", DescList{Type: DRAM}, &RequestOptions{Notif: []byte("exit")})
	if err != nil {
		t.Fatal(err)
	}
	r.Post()
	r.Wait(ctxT(t))
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	// The child's goodbye makes the parent forget it.
	waitFor(t, func() bool { _, err := a.remote("child"); return errors.Is(err, ErrUnknownPeer) })
}

// TestNotificationOrder posts many requests back to back, alternating
// shared memory and tcp towards one peer, and checks that the
// notifications arrive in posting order, each after its data.
func TestNotificationOrder(t *testing.T) {
	c := startChild(t, 1<<20)
	a := newAgent(t, "parent", Config{})
	if _, err := a.LoadRemote(ctxT(t), c.md); err != nil {
		t.Fatal(err)
	}
	cr := childRegion(t, c.md)
	src := make([]byte, 1<<20)
	fill(src, 11)
	lr, _ := a.RegisterMem(src)
	const n = 200
	var reqs []*Request
	for i := 0; i < n; i++ {
		opts := &RequestOptions{Notif: []byte(fmt.Sprintf("%d", i))}
		if i%50 == 49 {
			opts.Notif = []byte(fmt.Sprintf("check 11 0 %d c%d", 64<<10, i))
		}
		if i%2 == 1 {
			opts.Backend = BackendTCP
		}
		r, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{{Addr: lr.Addr(), Len: 64 << 10}}}, "child",
			DescList{Type: DRAM, Descs: []Desc{{Addr: cr.Base, Len: 64 << 10}}}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Post(); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	for _, r := range reqs {
		if err := r.Wait(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		want := fmt.Sprintf("N parent %d", i)
		if i%50 == 49 {
			want = fmt.Sprintf("OK c%d", i)
		}
		if l := c.next(t); l != want {
			t.Fatalf("notification %d: child said %q, want %q", i, l, want)
		}
	}
	exitChild(t, a, c)
}

// TestKilledPeer kills the target (kill -9) with a request in flight: the
// request fails with ErrRemoteDisconnect within a bounded time, the peer's
// metadata is dropped and its shared segments removed.
func TestKilledPeer(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		env  []string
	}{{"shm", Config{}, nil}, {"tcp", Config{DisableSHM: true, DisablePVM: true}, []string{"GCCL_SHM_DISABLE=1"}}} {
		t.Run(tc.name, func(t *testing.T) {
			c := startChild(t, 8<<20, tc.env...)
			a := newAgent(t, "parent", tc.cfg)
			if _, err := a.LoadRemote(ctxT(t), c.md); err != nil {
				t.Fatal(err)
			}
			cr := childRegion(t, c.md)
			src := make([]byte, 8<<20)
			lr, _ := a.RegisterMem(src)
			// Stop the child so the tcp request cannot finish, then kill it.
			c.stop(t)
			r, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{{Addr: lr.Addr(), Len: 8 << 20}}}, "child",
				DescList{Type: DRAM, Descs: []Desc{{Addr: cr.Base, Len: 8 << 20}}}, &RequestOptions{Backend: BackendTCP})
			if err != nil {
				t.Fatal(err)
			}
			if st, err := r.Post(); st != StatusInProgress || err != nil {
				t.Fatalf("Post: %v, %v", st, err)
			}
			time.Sleep(50 * time.Millisecond)
			if st, _ := r.Status(); st != StatusInProgress {
				t.Fatalf("request to a stopped peer is %v", st)
			}
			start := time.Now()
			c.cmd.Process.Kill()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := r.Wait(ctx); !errors.Is(err, ErrRemoteDisconnect) {
				t.Fatalf("in-flight request after kill -9: %v", err)
			}
			t.Logf("failed %v after the kill", time.Since(start))
			waitFor(t, func() bool { _, err := a.remote("child"); return errors.Is(err, ErrUnknownPeer) })
			if _, err := r.Post(); !errors.Is(err, ErrRemoteDisconnect) {
				t.Fatalf("Post to a dead peer: %v", err)
			}
			if cr.SHM != "" { // removed while still a zombie: not reaped yet
				waitFor(t, func() bool { _, err := os.Stat(cr.SHM); return os.IsNotExist(err) })
				left, _ := filepath.Glob(filepath.Dir(cr.SHM) + "/" + strings.Split(filepath.Base(cr.SHM), "-buf")[0] + "*")
				if len(left) != 0 {
					t.Fatalf("segments of the dead peer left: %v", left)
				}
			}
			r.Release()
		})
	}
}

// TestStalledPeer stops the target (SIGSTOP): a tcp request times out with
// ErrTimeout instead of staying in progress, and the silent peer is dropped
// after PeerTimeout.
func TestStalledPeer(t *testing.T) {
	c := startChild(t, 1<<20, "GCCL_SHM_DISABLE=1")
	a := newAgent(t, "parent", Config{DisableSHM: true, DisablePVM: true, RequestTimeout: 300 * time.Millisecond, PeerTimeout: 1500 * time.Millisecond})
	if _, err := a.LoadRemote(ctxT(t), c.md); err != nil {
		t.Fatal(err)
	}
	cr := childRegion(t, c.md)
	src := make([]byte, 4096)
	lr, _ := a.RegisterMem(src)
	stopped := time.Now()
	c.stop(t)
	r, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{{Addr: lr.Addr(), Len: 4096}}}, "child",
		DescList{Type: DRAM, Descs: []Desc{{Addr: cr.Base, Len: 4096}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r.Post()
	if err := r.Wait(ctxT(t)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("request to a stalled peer: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 2*time.Second {
		t.Fatalf("timed out after %v (RequestTimeout 300ms)", d)
	}
	waitFor(t, func() bool { _, err := a.remote("child"); return errors.Is(err, ErrUnknownPeer) })
	// The peer last spoke at most a keepalive interval (PeerTimeout/4) and
	// a watchdog tick before it stopped.
	if d := time.Since(stopped); d < time.Second {
		t.Fatalf("peer dropped %v after it stopped, long before PeerTimeout (1.5s)", d)
	}
	r.Release()
}

// TestKilledPeerTwinConnections: two connections to one agent (both ends
// dialled at once, as agents that load each other's metadata together
// do). The peer dies; one connection fails first and the application
// closes its agent at once, before the other connection's reader saw the
// end: the dead peer's segments must still be removed by the time Close
// returns (the fault soak found them left).
func TestKilledPeerTwinConnections(t *testing.T) {
	c := startChild(t, 1<<20)
	info, err := decodeMetadata(c.md)
	if err != nil {
		t.Fatal(err)
	}
	cr := childRegion(t, c.md)
	if cr.SHM == "" {
		t.Skip("the child has no shared segment (shared memory unavailable)")
	}
	a, err := New("parent", Config{ListenAddr: "127.0.0.1:0", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	first, err := a.dial(ctxT(t), info.Addr, info.Token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.dial(ctxT(t), info.Addr, info.Token); err != nil {
		t.Fatal(err)
	}
	c.cmd.Process.Kill()
	first.fail(fmt.Errorf("%w: child: notification: broken pipe", ErrRemoteDisconnect), true)
	a.Close()
	if _, err := os.Stat(cr.SHM); !os.IsNotExist(err) {
		t.Fatalf("the dead peer's segment %s outlived Close: %v", cr.SHM, err)
	}
}
