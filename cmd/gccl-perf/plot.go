package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

const plotUsage = `Usage: gccl-perf plot <file.json>... [-o chart.svg] [flags]

Draws bus bandwidth (GB/s) and time (µs) against message size (log2 axis)
from one or more gccl-perf -J files, to compare versions or transports at a
glance. Each file (and each type, op and root within it) is one colour:
out-of-place results solid, in-place dashed. The legend names the file, the
test, the ranks and the transport.

  -o, --output <file>        where to write the SVG; - is stdout (default -)
  -p, --placement <which>    both, out (out-of-place) or in (in-place)
                             (default both)
  -t, --title <text>         the chart's title (default: from the tests)
  -h, --help                 this text

Exit status: 0 when the chart was written, 1 when it could not be written,
2 for a bad command line or an unreadable input.
`

// plotOptions is a parsed plot command line.
type plotOptions struct {
	files     []string
	output    string // "-": stdout
	placement string // "both", "out" or "in"
	title     string
	help      bool
}

// parsePlotArgs reads the plot flags, which may come before, between or
// after the file names, as -o x, -o=x, --output x or --output=x.
func parsePlotArgs(args []string) (*plotOptions, error) {
	o := &plotOptions{output: "-", placement: "both"}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "-h" || arg == "--help" {
			o.help = true
			return o, nil
		}
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			o.files = append(o.files, arg)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		var dst *string
		switch name {
		case "o", "output":
			dst = &o.output
		case "p", "placement":
			dst = &o.placement
		case "t", "title":
			dst = &o.title
		default:
			return nil, fmt.Errorf("unknown flag %s", arg)
		}
		if !hasValue {
			if i+1 == len(args) {
				return nil, fmt.Errorf("flag %s needs a value", arg)
			}
			i++
			value = args[i]
		}
		*dst = value
	}
	switch {
	case len(o.files) == 0:
		return nil, errors.New("no input: name one or more gccl-perf -J files")
	case o.placement != "both" && o.placement != "out" && o.placement != "in":
		return nil, fmt.Errorf("invalid placement %q: want both, out or in", o.placement)
	}
	return o, nil
}

// plotInput is one -J file, named as the command line named it.
type plotInput struct {
	name   string
	report *jsonReport
}

// decodePlotInput reads a -J report and checks that it has something to
// plot. Unknown fields are allowed, so that reports of other gccl-perf
// versions still plot.
func decodePlotInput(name string, data []byte) (plotInput, error) {
	var rep jsonReport
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&rep); err != nil {
		return plotInput{}, fmt.Errorf("%s: not a gccl-perf JSON report: %v", name, err)
	}
	if len(rep.Rows) == 0 {
		return plotInput{}, fmt.Errorf("%s: no results to plot (is it a gccl-perf -J file?)", name)
	}
	return plotInput{name: name, report: &rep}, nil
}

// resultGroup is the rows of one type, op and root: one line per placement.
type resultGroup struct {
	dataType, redOp string
	root            int
}

// buildChart turns the inputs into series: for each input and each of its
// result groups, an out-of-place and an in-place series as placement asks.
func buildChart(inputs []plotInput, placement, title string) (*chart, error) {
	c := &chart{title: title}
	tests := map[string]bool{}
	color := 0
	for _, in := range inputs {
		rep := in.report
		tests[rep.Test] = true
		var groups []resultGroup
		points := map[resultGroup][2][]chartPoint{}
		for _, r := range rep.Rows {
			g := resultGroup{r.Type, r.RedOp, r.Root}
			if _, seen := points[g]; !seen {
				groups = append(groups, g)
			}
			pts := points[g]
			pts[0] = append(pts[0], chartPoint{r.Bytes, r.OutOfPlace.BusBW, r.OutOfPlace.TimeUs})
			pts[1] = append(pts[1], chartPoint{r.Bytes, r.InPlace.BusBW, r.InPlace.TimeUs})
			points[g] = pts
		}
		for _, g := range groups {
			label := fmt.Sprintf("%s: %s, %d ranks, %s", in.name, rep.Test, rep.Ranks, rep.Transport)
			if len(groups) > 1 {
				label += fmt.Sprintf(", %s %s", g.dataType, g.redOp)
				if g.root >= 0 {
					label += fmt.Sprintf(" root %d", g.root)
				}
			}
			if placement != "in" {
				c.series = append(c.series, chartSeries{label: label + " (out-of-place)", color: color, points: points[g][0]})
			}
			if placement != "out" {
				c.series = append(c.series, chartSeries{label: label + " (in-place)", color: color, dashed: true, points: points[g][1]})
			}
			color++
		}
	}
	if !hasPositiveSize(c.series) {
		return nil, errors.New("no results above 0 bytes to plot on a log2 size axis")
	}
	if c.title == "" {
		c.title = "gccl-perf"
		if len(tests) == 1 {
			c.title += " " + inputs[0].report.Test
		}
	}
	return c, nil
}

func hasPositiveSize(series []chartSeries) bool {
	for _, s := range series {
		for _, p := range s.points {
			if p.bytes > 0 {
				return true
			}
		}
	}
	return false
}

// runPlot is gccl-perf plot.
func runPlot(args []string, stdout, stderr io.Writer) int {
	bad := func(err error) int {
		fmt.Fprintf(stderr, "gccl-perf plot: %v\nRun gccl-perf plot -h for usage.\n", err)
		return 2
	}
	o, err := parsePlotArgs(args)
	if err != nil {
		return bad(err)
	}
	if o.help {
		fmt.Fprint(stdout, plotUsage)
		return 0
	}
	var inputs []plotInput
	for _, name := range o.files {
		data, err := os.ReadFile(name)
		if err != nil {
			return bad(err)
		}
		in, err := decodePlotInput(name, data)
		if err != nil {
			return bad(err)
		}
		inputs = append(inputs, in)
	}
	c, err := buildChart(inputs, o.placement, o.title)
	if err != nil {
		return bad(err)
	}
	svg := renderSVG(c)
	if o.output == "-" {
		_, err = stdout.Write(svg)
	} else {
		err = os.WriteFile(o.output, svg, 0o644)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gccl-perf plot: writing the chart: %v\n", err)
		return 1
	}
	return 0
}
