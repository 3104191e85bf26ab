//go:build !linux || !cgo

package verbs

import (
	"fmt"
	"runtime"
	"time"
)

// DefaultLibrary is the library Open would load.
const DefaultLibrary = "libibverbs.so.1"

var errNoLoader = fmt.Errorf("%w: libibverbs is loaded through cgo on Linux (this build: %s/%s, cgo off or not Linux)",
	ErrNotSupported, runtime.GOOS, runtime.GOARCH)

// DeviceNames reports why there are no devices in this build.
func DeviceNames() ([]string, error) { return nil, errNoLoader }

// Context is an open device; this build has none.
type Context struct{}

// Open reports why devices cannot be opened in this build.
func Open(string) (*Context, error) { return nil, errNoLoader }

func (c *Context) Name() string                          { return "" }
func (c *Context) Attr() DeviceAttr                      { return DeviceAttr{} }
func (c *Context) QueryPort(int) (PortAttr, error)       { return PortAttr{}, errNoLoader }
func (c *Context) QueryGID(int, int) (GID, error)        { return GID{}, errNoLoader }
func (c *Context) Port(int, Config) (Port, error)        { return Port{}, errNoLoader }
func (c *Context) CandidatePort(Candidate) (Port, error) { return Port{}, errNoLoader }
func (c *Context) AllocPD() (*PD, error)                 { return nil, errNoLoader }
func (c *Context) CreateCQ(int, bool) (*CQ, error)       { return nil, errNoLoader }
func (c *Context) Close() error                          { return nil }

// PD is a protection domain.
type PD struct{}

func (pd *PD) Register([]byte, Access) (*MR, error)           { return nil, errNoLoader }
func (pd *PD) RegisterAddr(uintptr, int, Access) (*MR, error) { return nil, errNoLoader }
func (pd *PD) CreateQP(QPOptions) (*QP, error)                { return nil, errNoLoader }
func (pd *PD) Close() error                                   { return nil }

// MR is a registered memory region.
type MR struct{}

func (m *MR) LKey() uint32     { return 0 }
func (m *MR) RKey() uint32     { return 0 }
func (m *MR) Addr() uint64     { return 0 }
func (m *MR) Len() int         { return 0 }
func (m *MR) Bytes() []byte    { return nil }
func (m *MR) SGE(int, int) SGE { return SGE{} }
func (m *MR) Close() error     { return nil }

// CQ is a completion queue.
type CQ struct{}

func (cq *CQ) Size() int                         { return 0 }
func (cq *CQ) Device() string                    { return "" }
func (cq *CQ) Poll([]WC) (int, error)            { return 0, errNoLoader }
func (cq *CQ) Wait([]WC, time.Time) (int, error) { return 0, errNoLoader }
func (cq *CQ) Check(wc *WC) error                { return wcError("", wc) }
func (cq *CQ) Arm() error                        { return errNoLoader }
func (cq *CQ) WaitEvent(time.Time) error         { return errNoLoader }
func (cq *CQ) Close() error                      { return nil }

// QP is a reliable-connected queue pair.
type QP struct{}

func (q *QP) QPN() uint32                    { return 0 }
func (q *QP) State() QPState                 { return QPReset }
func (q *QP) Caps() QPCaps                   { return QPCaps{} }
func (q *QP) Device() string                 { return "" }
func (q *QP) Endpoint() Endpoint             { return Endpoint{} }
func (q *QP) Connect(Endpoint, Config) error { return errNoLoader }
func (q *QP) Modify(QPAttr) error            { return errNoLoader }
func (q *QP) Flush() error                   { return errNoLoader }
func (q *QP) Query() (QPAttr, error)         { return QPAttr{}, errNoLoader }
func (q *QP) PostSend([]SendWR) error        { return errNoLoader }
func (q *QP) PostRecv([]RecvWR) error        { return errNoLoader }
func (q *QP) Close() error                   { return nil }

func libStatusString(WCStatus) (string, error) { return "", errNoLoader }
