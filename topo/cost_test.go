package topo

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

// liftGraphCostBound lets a test build terse documents of maxNodes devices
// (to measure the path search there); call the result to restore it.
func liftGraphCostBound() func() {
	old := graphCostPerDocByte
	graphCostPerDocByte = 1 << 30
	return func() { graphCostPerDocByte = old }
}

func TestPathSummaryBytes(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) == 8 && unsafe.Sizeof(pathSummary{}) != pathSummaryBytes {
		t.Errorf("pathSummary takes %d bytes, pathSummaryBytes says %d", unsafe.Sizeof(pathSummary{}), pathSummaryBytes)
	}
}

// A terse document naming hundreds of devices (500 network ports under one
// NIC, 9 KB) made Build allocate 8.7 MB, ~1000 times its size: the path
// table is quadratic in the devices. It is refused now, cheaply, with an
// error that gives the sizes; the same devices in a document of their
// real size, and real hosts, still build.
func TestBuildRefusesDocumentsThatCostFarMoreThanTheirSize(t *testing.T) {
	var b strings.Builder
	b.WriteString(`<system><cpu numaid="0"><nic>`)
	for i := 0; i < 500; i++ {
		fmt.Fprintf(&b, `<net name="n%d"/>`, i)
	}
	b.WriteString(`</nic></cpu></system>`)
	doc, err := ParseXML(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	g, err := Build(doc)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatalf("a %d-byte document of %d devices was built", b.Len(), g.count)
	}
	for _, want := range []string{"502 devices", "document"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d-byte document: %v; Build allocated %d bytes", b.Len(), err, alloc)
	if limit := uint64(64 * b.Len()); alloc > limit {
		t.Errorf("refusing a %d-byte document allocated %d bytes, more than 64x its size", b.Len(), alloc)
	}

	// Every published file builds, each within the bound.
	files, err := filepath.Glob("testdata/*.xml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no published files in testdata: %v", err)
	}
	for _, name := range files {
		text, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f := struct{ name, text string }{name, string(text)}
		doc, err := ParseXML(strings.NewReader(f.text))
		if err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&before)
		g, err := Build(doc)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %d bytes, %d devices, Build allocated %d bytes", f.name, len(f.text), g.count, alloc)
		if limit := graphCostFloor + graphCostPerDocByte*docBytes(doc); alloc > limit {
			t.Errorf("%s: Build allocated %d bytes, more than %d", f.name, alloc, limit)
		}
	}
}
