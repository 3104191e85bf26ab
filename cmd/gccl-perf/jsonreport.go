package main

import (
	"encoding/json"
	"io"
	"os"
	"runtime"
	"time"
)

// jsonReport is the -J output: the table plus what is needed to compare runs
// (library version, ranks and processes, transports, machine, Go version,
// date). gccl-perf plot reads it back.
type jsonReport struct {
	Library     string `json:"library"`
	Version     string `json:"version"`
	Test        string `json:"test"`
	CommandLine string `json:"command_line"`
	Ranks       int    `json:"ranks"`
	Processes   int    `json:"processes"`
	// Transport names the job's transports, joined by "+": "INPROC", "SHM",
	// "TCP", "SHM+TCP". Devices has each rank's transport to each peer.
	Transport   string     `json:"transport"`
	Devices     []rankInfo `json:"devices"`
	Memory      string     `json:"memory"`   // the buffers': "host", or "device" (GPU memory; Devices name each GPU)
	Hostname    string     `json:"hostname"` // the host of rank 0, which writes the report
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

// results is what a benchmark found: the table's rows and the footer.
type results struct {
	rows        []row
	outOfBounds int
	avgBusBW    float64
}

// newJSONReport assembles the report of a finished run.
func newJSONReport(cfg *config, env *environment, commandLine string, devices []rankInfo, res *results) *jsonReport {
	return &jsonReport{
		Library: "gccl", Version: version, Test: cfg.test.name, CommandLine: commandLine,
		Ranks: cfg.worldSize(), Processes: cfg.procs, Transport: jobTransports(devices), Devices: devices,
		Memory: cfg.memory.String(), Hostname: env.hostname, CPUModel: env.cpuModel, NumCPU: env.numCPU, GoVersion: env.goVersion,
		GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, Date: env.now().Format(time.RFC3339),
		Settings: jsonConfig{
			MinBytes: cfg.minBytes, MaxBytes: cfg.maxBytes, StepBytes: cfg.stepBytes, StepFactor: cfg.stepFactor,
			Iters: cfg.iters, WarmupIters: cfg.warmup, AggIters: cfg.aggIters, Check: cfg.check,
			Blocking: cfg.blocking, Average: cfg.average.String(),
		},
		Rows: res.rows, OutOfBounds: res.outOfBounds, AvgBusBW: res.avgBusBW, Passed: res.outOfBounds == 0,
	}
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
