package topo

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// Environment variables, NCCL's NCCL_TOPO_FILE and NCCL_TOPO_DUMP_FILE under
// gccl's prefix; the files are in NCCL's format, so either library reads
// the other's.
const (
	EnvTopoFile     = "GCCL_TOPO_FILE"      // read this file instead of detecting
	EnvTopoDumpFile = "GCCL_TOPO_DUMP_FILE" // write the graph in use here
)

// ReadFile reads an NCCL topology file and builds its graph.
func ReadFile(path string) (*Graph, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("topo: %w", err)
	}
	doc, err := ParseXML(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	g, err := Build(doc)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return g, nil
}

// WriteFile writes g's document to path in NCCL's format. It writes a
// temporary file beside path and renames it, so a reader never sees half a
// file.
func WriteFile(path string, g *Graph) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".gccl-topo-*")
	if err != nil {
		return fmt.Errorf("topo: %w", err)
	}
	_, werr := tmp.Write(MarshalXML(g.Doc))
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("topo: writing %s: %w", path, werr)
	}
	return nil
}

// Load returns this host's graph: read from GCCL_TOPO_FILE when it is set,
// detected by d otherwise; then written to GCCL_TOPO_DUMP_FILE when that is
// set. getenv is os.Getenv outside tests.
func Load(getenv func(string) string, d Detector) (*Graph, error) {
	var g *Graph
	var err error
	if f := getenv(EnvTopoFile); f != "" {
		g, err = ReadFile(f)
	} else {
		g, err = d.Detect()
	}
	if err != nil {
		return nil, err
	}
	if f := getenv(EnvTopoDumpFile); f != "" {
		if err := WriteFile(f, g); err != nil {
			return nil, err
		}
	}
	return g, nil
}
