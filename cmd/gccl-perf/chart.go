package main

import (
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The chart of gccl-perf plot: two panels over a shared log2 size axis, bus
// bandwidth (linear) above and time (log10) below, then a legend. Rendering
// is pure: the same chart gives the same bytes, so it is golden-tested.

// chartPoint is one size of a series.
type chartPoint struct {
	bytes  int64
	busBW  float64 // GB/s
	timeUs float64
}

// chartSeries is one line: a file's results in one placement.
type chartSeries struct {
	label  string
	color  int  // palette index, shared by the placements of one result set
	dashed bool // in-place
	points []chartPoint
}

type chart struct {
	title  string
	series []chartSeries
}

// palette is told apart by most colour-blind readers (Tableau 10).
var palette = []string{"#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"}

// Geometry, in SVG user units.
const (
	chartWidth     = 900
	plotLeft       = 80
	plotRight      = 870
	busPanelTop    = 60
	timePanelTop   = 370
	panelHeight    = 250
	legendTop      = 690
	legendRowSpace = 18
	maxXLabels     = 12
	maxYTicks      = 8
)

// axis maps data values onto a pixel range, linearly in v or in log10(v)
// or log2(v).
type axis struct {
	lo, hi     float64 // in transformed units
	pixLo, pix float64 // pixel of lo, and pixels from lo to hi (negative upwards)
	transform  func(float64) float64
}

func (a axis) at(v float64) float64 {
	return a.pixLo + (a.transform(v)-a.lo)/(a.hi-a.lo)*a.pix
}

func identity(v float64) float64 { return v }

// renderSVG draws c. Points that a log axis cannot show (size 0, time 0)
// are left out.
func renderSVG(c *chart) []byte {
	var minBytes, maxBytes int64 = math.MaxInt64, 0
	maxBus, minTime, maxTime := 0.0, math.Inf(1), 0.0
	for _, s := range c.series {
		for _, p := range s.points {
			if p.bytes <= 0 {
				continue
			}
			minBytes, maxBytes = min(minBytes, p.bytes), max(maxBytes, p.bytes)
			maxBus = max(maxBus, p.busBW)
			if p.timeUs > 0 {
				minTime, maxTime = min(minTime, p.timeUs), max(maxTime, p.timeUs)
			}
		}
	}
	if maxBytes == 0 { // nothing to show: an empty frame rather than NaNs
		minBytes, maxBytes = 1, 2
	}
	if maxTime == 0 {
		minTime, maxTime = 1, 10
	}

	x := axis{transform: math.Log2, pixLo: plotLeft, pix: plotRight - plotLeft,
		lo: math.Floor(math.Log2(float64(minBytes))), hi: math.Ceil(math.Log2(float64(maxBytes)))}
	if x.lo == x.hi {
		x.lo, x.hi = x.lo-1, x.hi+1
	}
	busStep := niceStep(maxBus / 5)
	busTop := math.Ceil(maxBus/busStep) * busStep
	if busTop == 0 {
		busTop = busStep
	}
	yBus := axis{transform: identity, pixLo: busPanelTop + panelHeight, pix: -panelHeight, lo: 0, hi: busTop}
	yTime := axis{transform: math.Log10, pixLo: timePanelTop + panelHeight, pix: -panelHeight,
		lo: math.Floor(math.Log10(minTime)), hi: math.Ceil(math.Log10(maxTime))}
	if yTime.lo == yTime.hi {
		yTime.hi++
	}

	height := legendTop + legendRowSpace*len(c.series) + 12
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartWidth, height)
	fmt.Fprintf(&b, `<text x="%d" y="30" font-size="16" text-anchor="middle">%s</text>`+"\n", chartWidth/2, escapeXML(c.title))

	// Bus bandwidth panel.
	var busTicks []float64
	for v := 0.0; v <= busTop*(1+1e-9); v += busStep {
		busTicks = append(busTicks, v)
	}
	drawPanel(&b, x, yBus, busTicks, busPanelTop, "busbw (GB/s)", func(v float64) string {
		return strconv.FormatFloat(v, 'f', stepDecimals(busStep), 64)
	})
	for _, s := range c.series {
		drawSeries(&b, s, x, yBus, func(p chartPoint) (float64, bool) { return p.busBW, true })
	}

	// Time panel, one tick per decade (fewer when they would crowd).
	var timeTicks []float64
	decadeStep := math.Ceil((yTime.hi - yTime.lo + 1) / maxYTicks)
	for k := yTime.lo; k <= yTime.hi; k += decadeStep {
		timeTicks = append(timeTicks, math.Pow(10, k))
	}
	drawPanel(&b, x, yTime, timeTicks, timePanelTop, "time (µs)", formatDecade)
	for _, s := range c.series {
		drawSeries(&b, s, x, yTime, func(p chartPoint) (float64, bool) { return p.timeUs, p.timeUs > 0 })
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">message size (bytes)</text>`+"\n",
		(plotLeft+plotRight)/2, timePanelTop+panelHeight+42)

	// Legend: a sample of each line and its label.
	for i, s := range c.series {
		y := legendTop + legendRowSpace*i
		color := palette[s.color%len(palette)]
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n",
			plotLeft, y, plotLeft+30, y, color, dashAttr(s.dashed))
		drawMarker(&b, plotLeft+15, float64(y), color, s.dashed)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", plotLeft+40, y+4, escapeXML(s.label))
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// drawPanel draws a panel's frame, grid, y ticks and title, and the shared
// size ticks under it.
func drawPanel(b *strings.Builder, x, y axis, yTicks []float64, top int, title string, yLabel func(float64) string) {
	bottom := top + panelHeight
	for _, v := range yTicks {
		py := y.at(v)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#dddddd"/>`+"\n", plotLeft, py, plotRight, py)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", plotLeft-6, py+4, yLabel(v))
	}
	every := math.Ceil((x.hi - x.lo + 1) / maxXLabels)
	for k := x.lo; k <= x.hi; k += every {
		px := x.at(math.Exp2(k))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#dddddd"/>`+"\n", px, top, px, bottom)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px, bottom+18, formatPow2(int(k)))
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>`+"\n",
		plotLeft, top, plotRight-plotLeft, panelHeight)
	fmt.Fprintf(b, `<text transform="translate(22 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n",
		top+panelHeight/2, escapeXML(title))
}

// drawSeries draws s's line and markers on one panel; value picks the
// panel's quantity and whether the point can be shown.
func drawSeries(b *strings.Builder, s chartSeries, x, y axis, value func(chartPoint) (float64, bool)) {
	color := palette[s.color%len(palette)]
	var pixels [][2]float64
	for _, p := range s.points {
		if v, ok := value(p); ok && p.bytes > 0 {
			pixels = append(pixels, [2]float64{x.at(float64(p.bytes)), y.at(v)})
		}
	}
	if len(pixels) == 0 {
		return
	}
	coords := make([]string, len(pixels))
	for i, px := range pixels {
		coords[i] = fmt.Sprintf("%.1f,%.1f", px[0], px[1])
	}
	fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5"%s points="%s"/>`+"\n",
		color, dashAttr(s.dashed), strings.Join(coords, " "))
	for _, px := range pixels {
		drawMarker(b, px[0], px[1], color, s.dashed)
	}
}

// drawMarker draws a point: filled for out-of-place, hollow for in-place.
func drawMarker(b *strings.Builder, cx, cy float64, color string, hollow bool) {
	fill := color
	if hollow {
		fill = "white"
	}
	fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s" stroke="%s"/>`+"\n", cx, cy, fill, color)
}

func dashAttr(dashed bool) string {
	if dashed {
		return ` stroke-dasharray="6 4"`
	}
	return ""
}

// niceStep rounds a rough tick step up to 1, 2 or 5 times a power of ten.
func niceStep(rough float64) float64 {
	if rough <= 0 || math.IsNaN(rough) || math.IsInf(rough, 0) {
		return 0.2 // an empty bandwidth axis still reads 0 to 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(rough)))
	for _, f := range []float64{1, 2, 5} {
		if rough <= f*mag*(1+1e-9) {
			return f * mag
		}
	}
	return 10 * mag
}

// stepDecimals is how many decimals tick labels need for a step.
func stepDecimals(step float64) int {
	return max(0, int(-math.Floor(math.Log10(step)+1e-9)))
}

// formatDecade labels a power of ten: 0.01, 1, 10000, then 1e5.
func formatDecade(v float64) string {
	k := int(math.Round(math.Log10(v)))
	if k > 4 {
		return fmt.Sprintf("1e%d", k)
	}
	return strconv.FormatFloat(math.Pow(10, float64(k)), 'f', max(0, -k), 64)
}

// formatPow2 labels 2^k bytes as nccl-tests users write sizes: 8, 64K, 32M.
func formatPow2(k int) string {
	if k < 0 {
		return strconv.FormatFloat(math.Exp2(float64(k)), 'f', -1, 64)
	}
	units := []string{"", "K", "M", "G", "T", "P"}
	u := min(k/10, len(units)-1)
	return strconv.FormatInt(int64(1)<<(k-10*u), 10) + units[u]
}

func escapeXML(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s)) // writes to a Builder never fail
	return b.String()
}
