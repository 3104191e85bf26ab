package main

import (
	"fmt"
	"github.com/gccl/gccl/internal/units"
	"io"
	"strings"
)

// The text report follows nccl-tests' printf formats column for column, so
// that scripts written for nccl-tests output read gccl-perf's too. The one
// difference: lines carry no trailing blanks.

// placementResult is one half of a row: the out-of-place or in-place run.
type placementResult struct {
	TimeUs  float64 `json:"time_us"`
	AlgBW   float64 `json:"algbw_gbps"`
	BusBW   float64 `json:"busbw_gbps"`
	Checked bool    `json:"checked"` // false with -c 0: Wrong means nothing
	Wrong   int64   `json:"wrong"`   // mismatching elements, summed over ranks
}

// row is one line of the table: one size of one type, op and root.
type row struct {
	Bytes      int64           `json:"size_bytes"`
	Count      int64           `json:"count"`
	Type       string          `json:"type"`
	RedOp      string          `json:"redop"`
	Root       int             `json:"root"`
	OutOfPlace placementResult `json:"out_of_place"`
	InPlace    placementResult `json:"in_place"`
}

// headerInfo is what the lines above the table say about the run.
type headerInfo struct {
	commandLine string
	cfg         *config
	devices     []rankInfo // every rank of the job
}

func writeHeader(w io.Writer, h headerInfo) {
	c := h.cfg
	step, stepKind := c.stepBytes, "bytes"
	if c.stepFactor > 1 {
		step, stepKind = c.stepFactor, "factor"
	}
	fmt.Fprintf(w, "# %s\n", h.commandLine)
	fmt.Fprintf(w, "# nThread 1 nGpus %d minBytes %d maxBytes %d step: %d(%s) warmup iters: %d iters: %d agg iters: %d validation: %d graph: 0\n",
		c.ranks, c.minBytes, c.maxBytes, step, stepKind, c.warmup, c.iters, c.aggIters, c.check)
	if c.blocking {
		fmt.Fprintf(w, "# Blocking Enabled: each rank waits for every collective before issuing the next\n")
	}
	if c.register {
		fmt.Fprintf(w, "# Registered buffers: send and receive buffers come from comm.Comm.Alloc (symmetric memory)\n")
	}
	if c.memory == memoryDevice {
		fmt.Fprintf(w, "# Memory: device (CUDA): send and receive buffers in GPU memory, on each rank's device below\n")
	}
	if c.deviceWindows {
		fmt.Fprintf(w, "# Registered device windows: calls queued on each rank's stream (stream-ordered); each loop ends with a stream synchronize\n")
	}
	fmt.Fprintf(w, "#\n# Using devices\n")
	for _, d := range h.devices {
		// Where nccl-tests prints the GPU's PCI address.
		where := "host"
		if d.BusID != "" {
			where = d.BusID
		}
		fmt.Fprintf(w, "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s\n",
			d.Rank, 0, d.Pid, d.Host, d.Device, where, strings.Join(d.transports(), "+"))
	}
	// In one process every pair is INPROC; across processes the pairs are
	// what a reader needs to interpret the numbers.
	if c.procs > 1 {
		for i, l := range transportLines(h.devices) {
			label := "Transports:"
			if i > 0 {
				label = ""
			}
			fmt.Fprintf(w, "#  %-11s %s\n", label, l)
		}
	}
	fmt.Fprintf(w, "#\n")
}

func writeTableHeader(w io.Writer) {
	lines := []string{
		fmt.Sprintf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place", "", "", "", "", ""),
		fmt.Sprintf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s",
			"size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"),
		fmt.Sprintf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s",
			"(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""),
	}
	for _, l := range lines {
		fmt.Fprintln(w, strings.TrimRight(l, " "))
	}
}

func writeRow(w io.Writer, r *row) {
	fmt.Fprintf(w, "%12d  %12d  %8s  %6s  %6d%s%s\n", r.Bytes, r.Count, r.Type, r.RedOp, r.Root,
		formatResult(&r.OutOfPlace), formatResult(&r.InPlace))
}

func formatResult(p *placementResult) string {
	wrong := "N/A"
	if p.Checked {
		wrong = fmt.Sprint(p.Wrong)
	}
	return fmt.Sprintf("  %7s  %6.2f  %6.2f  %5s", units.FormatMicros(p.TimeUs), p.AlgBW, p.BusBW, wrong)
}

// writeFooter writes nccl-tests' summary. outOfBounds counts the checks
// (row halves) that found wrong elements, as nccl-tests' error count does.
func writeFooter(w io.Writer, outOfBounds int, avgBusBW float64) {
	verdict := "OK"
	if outOfBounds > 0 {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "# Out of bounds values : %d %s\n", outOfBounds, verdict)
	// %.6g prints what C's %g does.
	fmt.Fprintf(w, "# Avg bus bandwidth    : %.6g\n", avgBusBW)
	fmt.Fprintf(w, "#\n")
}

// summarize returns the footer's figures for rows: how many checks failed,
// and the mean bus bandwidth over every out-of-place and in-place result.
func summarize(rows []row) (outOfBounds int, avgBusBW float64) {
	if len(rows) == 0 {
		return 0, 0
	}
	var sum float64
	for i := range rows {
		for _, p := range []*placementResult{&rows[i].OutOfPlace, &rows[i].InPlace} {
			sum += p.BusBW
			if p.Checked && p.Wrong > 0 {
				outOfBounds++
			}
		}
	}
	return outOfBounds, sum / float64(2*len(rows))
}
