package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/gomlx/gomlx/backends"
	_ "github.com/gomlx/gomlx/backends/simplego" // the pure-Go backend
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	gomlxctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/ddp"
)

// Config is one training run.
type Config struct {
	Batch     int     // examples per rank and step
	Epochs    int     // passes over the training set
	Steps     int     // stop after this many steps (0: the epochs decide)
	Hidden    int     // width of the hidden layer
	Optimizer string  // "adam" or "sgd"
	LR        float64 // learning rate
	Seed      uint64  // initial weights and data order
	LogEvery  int     // print the loss every this many steps (0: never)
	Check     bool    // compare gradients and weights across ranks
	Reducer   ddp.Config
	Backend   string // GoMLX backend configuration
}

// Result is what one rank's run ends with.
type Result struct {
	Losses   []float64 // the global loss of every step (rank 0's view)
	Accuracy float64   // on the test set, all ranks' shards together
	Steps    int
	// Per step, past the first (which compiles): the gradient exec, the
	// reducer (copies in and out, Wait) and the optimizer exec.
	Grad, Reduce, Apply time.Duration
	Stats               ddp.Stats
	MaxGradDiff         float64 // -check: averaged vs full-batch gradient at step 0
	MaxGrad             float64
}

// optimizer is what the apply exec needs of a GoMLX optimizer: its update
// from gradients computed elsewhere.
type optimizer interface {
	UpdateGraphWithGradients(ctx *gomlxctx.Context, grads []*Node, lossDType dtypes.DType)
}

// model is the 784-H-10 MLP.
func model(ctx *gomlxctx.Context, hidden int, x *Node) *Node {
	h := activations.Relu(layers.DenseWithBias(ctx.In("hidden"), x, hidden))
	return layers.DenseWithBias(ctx.In("output"), h, 10)
}

// Train runs one rank of data-parallel training over c: each rank takes
// its shard of every global batch (rank r: examples r*B..(r+1)*B-1 of the
// batch), computes its gradients with GoMLX, the Reducer averages them
// over the ranks, and every rank applies the same update. Rank 0 writes
// the log to out (nil: nowhere).
func Train(ctx context.Context, c *comm.Comm, data *MNIST, cfg Config, out io.Writer) (*Result, error) {
	rank, n := c.Rank(), c.Size()
	logf := func(format string, args ...any) {
		if rank == 0 && out != nil {
			fmt.Fprintf(out, format, args...)
		}
	}
	backend, err := backends.NewWithConfig(cfg.Backend)
	if err != nil {
		return nil, fmt.Errorf("GoMLX backend %q: %w", cfg.Backend, err)
	}
	defer backend.Finalize()

	mctx := gomlxctx.New()
	mctx.SetParam(gomlxctx.ParamInitialSeed, int64(cfg.Seed))
	var opt optimizer
	switch cfg.Optimizer {
	case "adam":
		opt = optimizers.Adam().LearningRate(cfg.LR).Done().(optimizer)
	case "sgd":
		opt = optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(cfg.LR)
	default:
		return nil, fmt.Errorf("unknown optimizer %q (adam, sgd)", cfg.Optimizer)
	}

	// A step is two execs: the gradients, reduced on the host between
	// them, then the optimizer. GoMLX cannot call out of a graph.
	gradExec, err := gomlxctx.NewExec(backend, mctx, func(ctx *gomlxctx.Context, x, y *Node) []*Node {
		logits := model(ctx, cfg.Hidden, x)
		loss := ReduceAllMean(losses.SparseCategoricalCrossEntropyLogits([]*Node{y}, []*Node{logits}))
		return append([]*Node{loss}, ctx.BuildTrainableVariablesGradientsGraph(loss)...)
	})
	if err != nil {
		return nil, err
	}
	defer gradExec.Finalize()
	evalExec, err := gomlxctx.NewExec(backend, mctx.Reuse(), func(ctx *gomlxctx.Context, x *Node) *Node {
		return ArgMax(model(ctx, cfg.Hidden, x), -1, dtypes.Int32)
	})
	if err != nil {
		return nil, err
	}
	defer evalExec.Finalize()

	global := n * cfg.Batch
	stepsPerEpoch := data.Train.Count() / global
	steps := cfg.Epochs * stepsPerEpoch
	if cfg.Steps > 0 {
		steps = min(steps, cfg.Steps)
	}
	if steps < 1 {
		return nil, fmt.Errorf("a global batch of %d leaves no step", global)
	}
	order := make([]int, data.Train.Count())
	x := tensors.FromShape(shapes.Make(dtypes.Float32, cfg.Batch, pixels))
	y := tensors.FromShape(shapes.Make(dtypes.Int32, cfg.Batch, 1))
	shard := func(s int) []int { // this rank's examples of global batch s
		e := s % stepsPerEpoch
		if e == 0 {
			shuffle(order, cfg.Seed, s/stepsPerEpoch)
		}
		return order[e*global+rank*cfg.Batch : e*global+(rank+1)*cfg.Batch]
	}

	// The first exec creates and initializes the variables (the same on
	// every rank, from the seed); rank 0's are broadcast anyway, as DDP
	// does, so that any initialization works.
	data.Train.fill(x, y, shard(0))
	if _, err := gradExec.Exec(x, y); err != nil {
		return nil, err
	}
	var vars []*gomlxctx.Variable
	var sizes []int
	var names []string
	for v := range mctx.IterVariables() {
		if v.Trainable {
			vars = append(vars, v)
			sizes = append(sizes, v.Shape().Size())
			names = append(names, v.ScopeAndName())
		}
	}
	rcfg := cfg.Reducer
	rcfg.Names = names
	red, err := ddp.New(ctx, c, sizes, &rcfg)
	if err != nil {
		return nil, err
	}
	defer red.Close()
	weights := func() [][]float32 {
		w := make([][]float32, len(vars))
		for i, v := range vars {
			w[i] = tensors.MustCopyFlatData[float32](v.MustValue())
		}
		return w
	}
	w0 := weights()
	if err := red.BroadcastParams(ctx, w0); err != nil {
		return nil, err
	}
	for i, v := range vars {
		tensors.MustMutableFlatData(v.MustValue(), func(f []float32) { copy(f, w0[i]) })
	}
	logf("ddp-mnist: %d ranks, batch %d per rank (%d global), %d steps, %s lr %g, %d parameters in %d buckets (%v compression, symmetric %v)\n",
		n, cfg.Batch, global, steps, cfg.Optimizer, cfg.LR, sum(sizes), len(red.Buckets()), rcfg.Compression, rcfg.Symmetric)

	applyExec, err := gomlxctx.NewExec(backend, mctx, func(ctx *gomlxctx.Context, grads []*Node) {
		g := grads[0].Graph()
		for _, v := range vars { // the optimizer updates the variables the graph uses
			v.ValueGraph(g)
		}
		opt.UpdateGraphWithGradients(ctx, grads, dtypes.Float32)
	})
	if err != nil {
		return nil, err
	}
	defer applyExec.Finalize()

	res := &Result{Steps: steps}
	args := make([]any, len(vars))
	lossBuf := []float32{0}
	for s := range steps {
		t0 := time.Now()
		data.Train.fill(x, y, shard(s))
		outs, err := gradExec.Exec(x, y)
		if err != nil {
			return nil, err
		}
		grads := outs[1:]
		t1 := time.Now()
		// GoMLX hands all the gradients over at once, last layer last:
		// mark them from the last, as a backward pass would produce them.
		for i := len(grads) - 1; i >= 0; i-- {
			var err error
			tensors.MustConstFlatData(grads[i], func(f []float32) { err = red.Set(i, f) })
			if err != nil {
				return nil, err
			}
		}
		if err := red.Wait(ctx); err != nil {
			return nil, err
		}
		for i, g := range grads {
			tensors.MustMutableFlatData(g, func(f []float32) { copy(f, red.Grad(i)) })
			args[i] = g
		}
		t2 := time.Now()
		if s == 0 && cfg.Check {
			if res.MaxGradDiff, res.MaxGrad, err = checkGradient(gradExec, data, order[:global], red); err != nil {
				return nil, err
			}
		}
		if _, err := applyExec.Exec(args...); err != nil {
			return nil, err
		}
		t3 := time.Now()
		if s > 0 {
			res.Grad += t1.Sub(t0)
			res.Reduce += t2.Sub(t1)
			res.Apply += t3.Sub(t2)
		}
		if cfg.LogEvery > 0 && (s%cfg.LogEvery == 0 || s == steps-1) {
			lossBuf[0] = tensors.ToScalar[float32](outs[0])
			if err := comm.AllReduce(ctx, c, lossBuf, lossBuf, comm.Avg); err != nil {
				return nil, err
			}
			res.Losses = append(res.Losses, float64(lossBuf[0]))
			logf("step %4d  loss %.6f\n", s, lossBuf[0])
		}
		for _, t := range outs {
			t.FinalizeAll()
		}
	}
	res.Stats = red.Stats()

	// The test set, sharded over the ranks too.
	correct, err := evaluate(evalExec, data.Test, rank, n)
	if err != nil {
		return nil, err
	}
	counts := []int64{correct}
	if err := comm.AllReduce(ctx, c, counts, counts, comm.Sum); err != nil {
		return nil, err
	}
	res.Accuracy = float64(counts[0]) / float64(data.Test.Count())
	logf("test accuracy %.2f%% (%d of %d images) after %d steps\n", 100*res.Accuracy, counts[0], data.Test.Count(), steps)

	if cfg.Check {
		logf("check: step 0: averaged gradient vs full-batch gradient: max |diff| %.3g (max |gradient| %.3g)\n", res.MaxGradDiff, res.MaxGrad)
		if err := red.CheckReplicas(ctx, weights()); err != nil {
			return nil, fmt.Errorf("check: weights: %w", err)
		}
		logf("check: weights identical on all %d ranks (bitwise)\n", n)
	}
	return res, nil
}

// checkGradient computes, on this rank alone, the gradient of the whole
// global batch (every rank's shard) and compares it with the reduced one.
func checkGradient(gradExec *gomlxctx.Exec, data *MNIST, batch []int, red *ddp.Reducer) (maxDiff, maxGrad float64, err error) {
	x := tensors.FromShape(shapes.Make(dtypes.Float32, len(batch), pixels))
	y := tensors.FromShape(shapes.Make(dtypes.Int32, len(batch), 1))
	data.Train.fill(x, y, batch)
	outs, err := gradExec.Exec(x, y)
	if err != nil {
		return 0, 0, err
	}
	for i, g := range outs[1:] {
		tensors.MustConstFlatData(g, func(f []float32) {
			for j, v := range f {
				maxDiff = math.Max(maxDiff, math.Abs(float64(v)-float64(red.Grad(i)[j])))
				maxGrad = math.Max(maxGrad, math.Abs(float64(v)))
			}
		})
	}
	for _, t := range outs {
		t.FinalizeAll()
	}
	return maxDiff, maxGrad, nil
}

// evaluate counts the right answers on rank's shard of the test set.
func evaluate(evalExec *gomlxctx.Exec, set *Set, rank, n int) (int64, error) {
	const batch = 500
	lo, hi := rank*set.Count()/n, (rank+1)*set.Count()/n
	var correct int64
	for start := lo; start < hi; start += batch {
		idx := make([]int, min(batch, hi-start))
		for k := range idx {
			idx[k] = start + k
		}
		x := tensors.FromShape(shapes.Make(dtypes.Float32, len(idx), pixels))
		set.fill(x, nil, idx)
		pred, err := evalExec.Exec(x)
		if err != nil {
			return 0, err
		}
		tensors.MustConstFlatData(pred[0], func(p []int32) {
			for k, i := range idx {
				if p[k] == int32(set.Labels[i]) {
					correct++
				}
			}
		})
		pred[0].FinalizeAll()
		x.FinalizeAll()
	}
	return correct, nil
}

// shuffle sets order to the data order of an epoch: the same on every
// rank, whatever the number of ranks.
func shuffle(order []int, seed uint64, epoch int) {
	for i := range order {
		order[i] = i
	}
	rand.New(rand.NewPCG(seed, uint64(epoch))).Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
}

func sum(s []int) int {
	t := 0
	for _, v := range s {
		t += v
	}
	return t
}
