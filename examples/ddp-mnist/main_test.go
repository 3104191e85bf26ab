package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// argsEnv, set in the environment, makes the test binary run ddp-mnist
// with these arguments instead of the tests: TestGcclRun starts it so as a
// rank of a gccl-run job.
const argsEnv = "DDP_MNIST_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(argsEnv); ok {
		if err := run(strings.Fields(args), os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "ddp-mnist:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const testSteps = 50

var mnist = sync.OnceValues(func() (*MNIST, error) { return LoadMNIST("") })

func testConfig(batch int) Config {
	return Config{Batch: batch, Epochs: 1, Steps: testSteps, Hidden: 128, Optimizer: "adam", LR: 0.001,
		Seed: 42, LogEvery: 1, Check: true, Backend: "go:parallelism=1,ops_sequential"}
}

// train runs ranks goroutine ranks of batch examples each, once per
// configuration for the whole test binary.
func train(t *testing.T, ranks, batch int) []*Result {
	t.Helper()
	key := [2]int{ranks, batch}
	runsMu.Lock()
	defer runsMu.Unlock()
	if rs, ok := runs[key]; ok {
		return rs
	}
	data, err := mnist()
	require.NoError(t, err)
	start := time.Now()
	rs, err := TrainLocal(context.Background(), ranks, data, testConfig(batch), nil)
	require.NoError(t, err)
	t.Logf("%d ranks x batch %d: %d steps in %v", ranks, batch, testSteps, time.Since(start).Round(time.Millisecond))
	runs[key] = rs
	return rs
}

var (
	runsMu sync.Mutex
	runs   = map[[2]int][]*Result{}
)

// Two ranks learn: the loss falls, the averaged gradient is the full-batch
// gradient, and the weights end identical (Train checks them with
// CheckReplicas and fails if they differ).
func TestTwoRanks(t *testing.T) {
	rs := train(t, 2, 64)
	for r, res := range rs {
		require.Len(t, res.Losses, testSteps, "rank %d", r)
		require.Less(t, res.MaxGradDiff, 1e-6, "rank %d: averaged vs full-batch gradient", r)
		require.Positive(t, res.MaxGrad)
		require.Equal(t, rs[0].Losses, res.Losses, "every rank sees the same global loss")
		require.Equal(t, rs[0].Accuracy, res.Accuracy)
	}
	l := rs[0].Losses
	require.Less(t, l[testSteps-1], l[0]/3, "the loss falls: %v", l)
	require.Greater(t, rs[0].Accuracy, 0.8, "test accuracy after %d steps", testSteps)
	t.Logf("loss %.4f -> %.4f, accuracy %.2f%%, max |avg - full| %.3g", l[0], l[testSteps-1], 100*rs[0].Accuracy, rs[0].MaxGradDiff)
}

// One rank with batch 128 and two with batch 64 see the same examples each
// step: their loss curves agree, well within 3 significant digits.
func TestLossCurveIndependentOfRanks(t *testing.T) {
	one, two := train(t, 1, 128)[0].Losses, train(t, 2, 64)[0].Losses
	require.Len(t, one, testSteps)
	worst := 0.0
	for s := range one {
		rel := math.Abs(one[s]-two[s]) / math.Abs(one[s])
		worst = math.Max(worst, rel)
		require.Less(t, rel, 5e-4, "step %d: 1 rank %.6f, 2 ranks %.6f", s, one[s], two[s])
	}
	t.Logf("largest relative difference over %d steps: %.2g", testSteps, worst)
}

// The same two ranks as processes under gccl-run: they print the same
// losses as the goroutine ranks, to the last digit.
func TestGcclRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gccl-run and starts processes")
	}
	dir := t.TempDir()
	gcclRun := filepath.Join(dir, "gccl-run")
	build := exec.Command("go", "build", "-o", gcclRun, "github.com/gccl/gccl/cmd/gccl-run")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gcclRun, "-np", "2", os.Args[0])
	cmd.Env = append(envWithoutJob(), fmt.Sprintf("%s=-batch 64 -steps %d -check -log-every 1", argsEnv, testSteps))
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	require.NoError(t, cmd.Run(), buf.String())
	got := buf.String()
	require.Contains(t, got, "[rank 0] check: weights identical on all 2 ranks (bitwise)")
	require.Contains(t, got, "[rank 0] test accuracy")
	require.Contains(t, got, "[rank 1] rank 1: 50 steps")

	local := train(t, 2, 64)[0].Losses
	re := regexp.MustCompile(`\[rank 0\] step +(\d+) +loss ([0-9.]+)`)
	matches := re.FindAllStringSubmatch(got, -1)
	require.Len(t, matches, testSteps, got)
	for _, m := range matches {
		s, _ := strconv.Atoi(m[1])
		require.Equal(t, fmt.Sprintf("%.6f", local[s]), m[2], "step %d: processes vs goroutines", s)
	}
}

// envWithoutJob is the environment minus what describes a job, so that
// an outer launcher cannot leak into the one the test starts.
func envWithoutJob() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "GCCL_"), strings.HasPrefix(k, "SLURM_"), strings.HasPrefix(k, "OMPI_"),
			strings.HasPrefix(k, "PMI_"), k == "RANK", k == "WORLD_SIZE", k == "LOCAL_RANK",
			k == "LOCAL_WORLD_SIZE", k == "MASTER_ADDR", k == "MASTER_PORT":
			continue
		}
		env = append(env, kv)
	}
	return env
}
