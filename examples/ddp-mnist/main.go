// Command ddp-mnist trains a 784-128-10 MLP on MNIST with GoMLX,
// data-parallel over gccl: every rank computes the gradients of its shard
// of each batch, a ddp.Reducer averages them across the ranks, and every
// rank applies the same update, so the weights stay identical everywhere.
//
//	go run . -local 2                              # 2 ranks as goroutines of this process
//	go build -o ddp-mnist . && go tool gccl-run -np 2 ./ddp-mnist   # 2 processes
//	go run . -local 2 -steps 50 -check             # also check gradients and weights
//
// The ranks' global batch is the same for any number of ranks at the same
// global size (-local 1 -batch 128 and -local 2 -batch 64 see the same
// examples each step), so their loss curves agree to rounding.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/ddp"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ddp-mnist:", err)
		os.Exit(1)
	}
}

// run parses the flags and trains, in this process (-local N) or as one
// rank of a job that a launcher started.
func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("ddp-mnist", flag.ContinueOnError)
	var cfg Config
	local := fs.Int("local", 0, "run `N` ranks as goroutines of this process (0: one rank of a gccl-run job, or 1 alone)")
	fs.IntVar(&cfg.Batch, "batch", 64, "examples per rank and step")
	fs.IntVar(&cfg.Epochs, "epochs", 1, "passes over the training set")
	fs.IntVar(&cfg.Steps, "steps", 0, "stop after `N` steps (0: after the epochs)")
	fs.IntVar(&cfg.Hidden, "hidden", 128, "width of the hidden layer")
	fs.StringVar(&cfg.Optimizer, "opt", "adam", "optimizer: adam or sgd")
	fs.Float64Var(&cfg.LR, "lr", 0.001, "learning rate")
	fs.Uint64Var(&cfg.Seed, "seed", 42, "seed of the initial weights and the data order")
	fs.IntVar(&cfg.LogEvery, "log-every", 50, "print the loss every `N` steps (0: never)")
	fs.BoolVar(&cfg.Check, "check", false, "compare the averaged gradient with the full-batch gradient at step 0, and the weights across ranks at the end")
	bucketKiB := fs.Int("bucket-kib", 0, "bucket size in KiB (0: 25 MiB, DDP's default)")
	firstKiB := fs.Int("first-bucket-kib", 0, "first bucket's size in KiB (0: 1 MiB)")
	fs.BoolVar(&cfg.Reducer.Symmetric, "symmetric", false, "put the buckets in Comm.Alloc memory (zero-copy all-reduce)")
	compress := fs.String("compress", "none", "bucket compression: none, bf16 or fp16")
	fs.StringVar(&cfg.Backend, "backend", "go:parallelism=1,ops_sequential", "GoMLX backend configuration")
	dataDir := fs.String("data", "", "MNIST `dir` (default: the GoMNIST module's data/ in Go's module cache)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Reducer.BucketBytes, cfg.Reducer.FirstBucketBytes = *bucketKiB<<10, *firstKiB<<10
	switch *compress {
	case "none":
	case "bf16":
		cfg.Reducer.Compression = ddp.BFloat16
	case "fp16":
		cfg.Reducer.Compression = ddp.Float16
	default:
		return fmt.Errorf("-compress %q: none, bf16 or fp16", *compress)
	}
	data, err := LoadMNIST(*dataDir)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if *local > 0 {
		results, err := TrainLocal(ctx, *local, data, cfg, out)
		if err != nil {
			return err
		}
		for r, res := range results {
			summary(out, r, res)
		}
		return nil
	}
	c, err := comm.Init(ctx, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := Train(ctx, c, data, cfg, out)
	if err != nil {
		return fmt.Errorf("rank %d: %w", c.Rank(), err)
	}
	summary(out, c.Rank(), res)
	return nil
}

// TrainLocal trains with n ranks that are goroutines of this process.
func TrainLocal(ctx context.Context, n int, data *MNIST, cfg Config, out io.Writer) ([]*Result, error) {
	cs, err := comm.InitLocal(n, nil)
	if err != nil {
		return nil, err
	}
	results, errs := make([]*Result, n), make([]error, n)
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() {
			results[r], errs[r] = Train(ctx, c, data, cfg, out)
			if errs[r] != nil {
				c.Abort(errs[r]) // the others stop too, rather than wait for this rank
			}
		})
	}
	wg.Wait()
	for _, c := range cs {
		c.Close()
	}
	for r, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return results, nil
}

func summary(out io.Writer, rank int, res *Result) {
	steps := time.Duration(max(res.Steps-1, 1))
	grad, reduce, apply := res.Grad/steps, res.Reduce/steps, res.Apply/steps
	total := grad + reduce + apply
	s := res.Stats
	fmt.Fprintf(out, "rank %d: %d steps, %.2f ms/step after the first: gradients %.2f ms, reducer %.2f ms (%.1f%%), optimizer %.2f ms; all-reduce %.2f ms/step, %.0f%% of it overlapped\n",
		rank, res.Steps, ms(total), ms(grad), ms(reduce), 100*float64(reduce)/float64(total), ms(apply),
		ms(s.Comm/time.Duration(max(s.Steps, 1))), 100*s.Overlap())
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// GoMLX v0.26.0 builds the gradient of a matrix product as a broadcast
// multiply and a sum over a [i, j, k] tensor: 7-11x slower steps and 4x the
// memory on this model (later versions fixed it). This replaces it with two
// matrix products, equal to float32 rounding.
func init() {
	orig := VJPRegistration[NodeTypeDot]
	VJPRegistration[NodeTypeDot] = func(node *Node, vjps []*Node, s shapes.Shape) []*Node {
		in := node.Inputs()
		a, b := in[0], in[1]
		if a.Rank() != 2 || b.Rank() != 2 {
			return orig(node, vjps, s)
		}
		v := vjps[0] // [i, k], for a [i, j] and b [j, k]
		return []*Node{Dot(v, Transpose(b, 0, 1)), Dot(Transpose(a, 0, 1), v)}
	}
}
