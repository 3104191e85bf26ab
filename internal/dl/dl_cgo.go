//go:build linux && cgo

package dl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

static void *dl_open(const char *path, const char **err) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) *err = dlerror();
	return h;
}
*/
import "C"

import (
	"errors"
	"unsafe"
)

// Library is an open shared library.
type Library struct{ h unsafe.Pointer }

// Open loads the library at path, a file name that the dynamic loader
// searches for or a path, resolving its symbols now. The error is the
// loader's message.
func Open(path string) (*Library, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	h := C.dl_open(cpath, &cerr)
	if h == nil {
		return nil, errors.New(C.GoString(cerr))
	}
	return &Library{h: h}, nil
}

// Sym returns the address of the library's symbol name, or nil if it has
// none.
func (l *Library) Sym(name string) unsafe.Pointer {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.dlsym(l.h, cname)
}

// Close unloads the library (dlclose); its symbols' addresses must not be
// used after.
func (l *Library) Close() { C.dlclose(l.h) }
