package main

import (
	"encoding/json"
	"io"
	"os"
)

// jsonReport is the -J output: the table plus what is needed to compare runs
// (library version, rank count, transport, machine, Go version, date).
type jsonReport struct {
	Library     string     `json:"library"`
	Version     string     `json:"version"`
	Test        string     `json:"test"`
	CommandLine string     `json:"command_line"`
	Ranks       int        `json:"ranks"`
	Transport   string     `json:"transport"`
	Hostname    string     `json:"hostname"`
	CPUModel    string     `json:"cpu_model"`
	NumCPU      int        `json:"num_cpu"`
	GoVersion   string     `json:"go_version"`
	GOOS        string     `json:"goos"`
	GOARCH      string     `json:"goarch"`
	Date        string     `json:"date"` // RFC 3339
	Settings    jsonConfig `json:"settings"`
	Rows        []row      `json:"results"`
	OutOfBounds int        `json:"out_of_bounds"`
	AvgBusBW    float64    `json:"avg_busbw_gbps"`
	Passed      bool       `json:"passed"`
}

// jsonConfig records the flags that shape the numbers.
type jsonConfig struct {
	MinBytes    int64  `json:"min_bytes"`
	MaxBytes    int64  `json:"max_bytes"`
	StepBytes   int64  `json:"step_bytes"`
	StepFactor  int64  `json:"step_factor"`
	Iters       int    `json:"iters"`
	WarmupIters int    `json:"warmup_iters"`
	AggIters    int    `json:"agg_iters"`
	Check       int    `json:"check"`
	Blocking    bool   `json:"blocking"`
	Average     string `json:"average"` // rank0, mean, min or max
}

func (a averageMode) String() string {
	return [...]string{"rank0", "mean", "min", "max"}[a]
}

func writeJSON(w io.Writer, r *jsonReport) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func writeJSONFile(path string, r *jsonReport) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := writeJSON(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
