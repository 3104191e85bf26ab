// Package logx configures gccl's logging from the environment, the way NCCL
// users expect: GCCL_DEBUG=WARN (default), INFO or TRACE sets the level, and
// GCCL_DEBUG_SUBSYS=INIT,COLL,... (or ^SUBSYS to exclude) picks subsystems.
// Records go to standard error as "host:pid gccl LEVEL [SUBSYS] message k=v",
// or to the file GCCL_DEBUG_FILE names (%h: the host name, %p: the pid).
package logx

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
)

// LevelTrace is below slog's Debug, for per-operation detail.
const LevelTrace = slog.LevelDebug - 4

var (
	once sync.Once
	def  *slog.Logger
)

// Default returns the process-wide logger configured from the environment.
func Default() *slog.Logger {
	once.Do(func() {
		var w io.Writer = os.Stderr
		if pattern := os.Getenv("GCCL_DEBUG_FILE"); pattern != "" {
			f, err := OpenDebugFile(pattern)
			if err != nil {
				fmt.Fprintf(os.Stderr, "gccl: GCCL_DEBUG_FILE: %v; logging to standard error\n", err)
			} else {
				w = f // open for the life of the process, as NCCL's is
			}
		}
		def = New(w, os.Getenv("GCCL_DEBUG"), os.Getenv("GCCL_DEBUG_SUBSYS"))
	})
	return def
}

// OpenDebugFile creates (or truncates) the log file that pattern names, as
// NCCL_DEBUG_FILE does: %h stands for the host name and %p for the pid, so
// that every process of a job writes its own (%% is a percent sign).
func OpenDebugFile(pattern string) (*os.File, error) {
	host, _ := os.Hostname()
	return os.OpenFile(ExpandDebugFile(pattern, host, os.Getpid()), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
}

// ExpandDebugFile replaces %h, %p and %% in pattern; any other % stays.
func ExpandDebugFile(pattern, host string, pid int) string {
	var b strings.Builder
	for i := 0; i < len(pattern); i++ {
		if pattern[i] != '%' || i+1 == len(pattern) {
			b.WriteByte(pattern[i])
			continue
		}
		switch pattern[i+1] {
		case 'h':
			b.WriteString(host)
		case 'p':
			fmt.Fprint(&b, pid)
		case '%':
			b.WriteByte('%')
		default:
			b.WriteString(pattern[i : i+2])
		}
		i++
	}
	return b.String()
}

// New returns a logger writing to w at the given GCCL_DEBUG level, limited to
// the given GCCL_DEBUG_SUBSYS list.
func New(w io.Writer, level, subsys string) *slog.Logger {
	h := &handler{w: w, mu: &sync.Mutex{}, level: ParseLevel(level)}
	host, _ := os.Hostname()
	h.prefix = fmt.Sprintf("%s:%d gccl", host, os.Getpid())
	if subsys = strings.TrimSpace(subsys); subsys != "" && !strings.EqualFold(subsys, "ALL") {
		h.subsys = map[string]bool{}
		h.exclude = strings.HasPrefix(subsys, "^")
		for _, s := range strings.Split(strings.TrimPrefix(subsys, "^"), ",") {
			h.subsys[strings.ToUpper(strings.TrimSpace(s))] = true
		}
	}
	return slog.New(h)
}

// ParseLevel maps GCCL_DEBUG values to slog levels (WARN when unset or unknown).
func ParseLevel(s string) slog.Level {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "TRACE":
		return LevelTrace
	case "DEBUG":
		return slog.LevelDebug
	case "INFO":
		return slog.LevelInfo
	case "ERROR":
		return slog.LevelError
	case "VERSION", "WARN", "":
		return slog.LevelWarn
	}
	return slog.LevelWarn
}

type handler struct {
	w       io.Writer
	mu      *sync.Mutex
	level   slog.Level
	prefix  string
	subsys  map[string]bool
	exclude bool
	attrs   []slog.Attr
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *handler) Handle(_ context.Context, r slog.Record) error {
	sub := ""
	var b strings.Builder
	add := func(a slog.Attr) {
		if a.Key == "subsys" {
			sub = a.Value.String()
			return
		}
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(func(a slog.Attr) bool { add(a); return true })
	if h.subsys != nil && sub != "" && h.subsys[sub] == h.exclude {
		return nil
	}
	lvl := r.Level.String()
	if r.Level <= LevelTrace {
		lvl = "TRACE"
	}
	if sub != "" {
		sub = " " + sub
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := fmt.Fprintf(h.w, "%s %s%s %s%s\n", h.prefix, lvl, sub, r.Message, b.String())
	return err
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr{}, h.attrs...), as...)
	return &c
}

func (h *handler) WithGroup(string) slog.Handler { return h }
