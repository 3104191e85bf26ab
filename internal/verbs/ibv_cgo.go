//go:build linux && cgo

package verbs

/*
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include "ibv_abi.h"

// libibverbs' entry points, resolved by Go (dlsym) in this order: see
// symbols in ibv_cgo.go.
enum {
	F_GET_DEVICE_LIST, F_FREE_DEVICE_LIST, F_GET_DEVICE_NAME, F_OPEN_DEVICE, F_CLOSE_DEVICE,
	F_QUERY_DEVICE, F_QUERY_PORT, F_QUERY_GID, F_ALLOC_PD, F_DEALLOC_PD, F_REG_MR, F_DEREG_MR,
	F_CREATE_COMP_CHANNEL, F_DESTROY_COMP_CHANNEL, F_CREATE_CQ, F_DESTROY_CQ, F_GET_CQ_EVENT,
	F_ACK_CQ_EVENTS, F_CREATE_QP, F_MODIFY_QP, F_QUERY_QP, F_DESTROY_QP, F_WC_STATUS_STR, F_COUNT
};
static void *gv_fn[F_COUNT];
static void gv_set(int i, void *p) { gv_fn[i] = p; }

// A pointer result and the errno of a call that returned NULL.
typedef struct { void *p; int err; } gv_ptr;
static gv_ptr gv_res(void *p) { gv_ptr r = {p, 0}; if (!p) r.err = errno ? errno : EIO; return r; }

// Device names, NUL-separated, into buf; returns the count, or -errno.
static int gv_device_names(char *buf, int len) {
	int n = 0, used = 0;
	errno = 0;
	struct ibv_device **l = ((struct ibv_device **(*)(int *))gv_fn[F_GET_DEVICE_LIST])(&n);
	if (!l) return -(errno ? errno : EIO);
	for (int i = 0; i < n; i++) {
		const char *s = ((const char *(*)(struct ibv_device *))gv_fn[F_GET_DEVICE_NAME])(l[i]);
		int k = strlen(s) + 1;
		if (used + k > len) { n = i; break; }
		memcpy(buf + used, s, k);
		used += k;
	}
	((void (*)(struct ibv_device **))gv_fn[F_FREE_DEVICE_LIST])(l);
	return n;
}

static gv_ptr gv_open(const char *name) {
	int n = 0;
	gv_ptr r = {NULL, ENODEV};
	errno = 0;
	struct ibv_device **l = ((struct ibv_device **(*)(int *))gv_fn[F_GET_DEVICE_LIST])(&n);
	if (!l) { r.err = errno ? errno : EIO; return r; }
	for (int i = 0; i < n; i++) {
		if (strcmp(((const char *(*)(struct ibv_device *))gv_fn[F_GET_DEVICE_NAME])(l[i]), name) == 0) {
			errno = 0;
			r = gv_res(((struct ibv_context *(*)(struct ibv_device *))gv_fn[F_OPEN_DEVICE])(l[i]));
			break;
		}
	}
	((void (*)(struct ibv_device **))gv_fn[F_FREE_DEVICE_LIST])(l);
	return r;
}

static int gv_close_device(struct ibv_context *c) { return ((int (*)(struct ibv_context *))gv_fn[F_CLOSE_DEVICE])(c); }

static int gv_query_device(struct ibv_context *c, struct ibv_device_attr *a) {
	return ((int (*)(struct ibv_context *, struct ibv_device_attr *))gv_fn[F_QUERY_DEVICE])(c, a);
}

// The exported ibv_query_port fills the prefix of struct ibv_port_attr
// that its library version knows; a larger zeroed buffer takes whatever
// it writes.
static int gv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
	union { struct ibv_port_attr a; char pad[512]; } u;
	memset(&u, 0, sizeof u);
	int rc = ((int (*)(struct ibv_context *, uint8_t, void *))gv_fn[F_QUERY_PORT])(c, port, &u);
	*a = u.a;
	return rc;
}

static int gv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *g) {
	errno = 0;
	int rc = ((int (*)(struct ibv_context *, uint8_t, int, union ibv_gid *))gv_fn[F_QUERY_GID])(c, port, index, g);
	return rc ? (errno ? errno : rc) : 0;
}

static gv_ptr gv_alloc_pd(struct ibv_context *c) {
	errno = 0;
	return gv_res(((struct ibv_pd *(*)(struct ibv_context *))gv_fn[F_ALLOC_PD])(c));
}
static int gv_dealloc_pd(struct ibv_pd *p) { return ((int (*)(struct ibv_pd *))gv_fn[F_DEALLOC_PD])(p); }

static gv_ptr gv_reg_mr(struct ibv_pd *p, uintptr_t addr, size_t len, int access) {
	errno = 0;
	return gv_res(((struct ibv_mr *(*)(struct ibv_pd *, void *, size_t, int))gv_fn[F_REG_MR])(p, (void *)addr, len, access));
}
static int gv_dereg_mr(struct ibv_mr *m) { return ((int (*)(struct ibv_mr *))gv_fn[F_DEREG_MR])(m); }

// A completion channel whose descriptor does not block: get_cq_event then
// fails with EAGAIN when no event is queued, and Go's poller watches it.
static gv_ptr gv_create_channel(struct ibv_context *c) {
	errno = 0;
	gv_ptr r = gv_res(((struct ibv_comp_channel *(*)(struct ibv_context *))gv_fn[F_CREATE_COMP_CHANNEL])(c));
	if (r.p) {
		struct ibv_comp_channel *ch = r.p;
		int fl = fcntl(ch->fd, F_GETFL);
		if (fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
			r.err = errno;
			((int (*)(struct ibv_comp_channel *))gv_fn[F_DESTROY_COMP_CHANNEL])(ch);
			r.p = NULL;
		}
	}
	return r;
}
static int gv_destroy_channel(struct ibv_comp_channel *ch) {
	return ((int (*)(struct ibv_comp_channel *))gv_fn[F_DESTROY_COMP_CHANNEL])(ch);
}

static gv_ptr gv_create_cq(struct ibv_context *c, int cqe, struct ibv_comp_channel *ch) {
	errno = 0;
	return gv_res(((struct ibv_cq *(*)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int))gv_fn[F_CREATE_CQ])(c, cqe, NULL, ch, 0));
}
static int gv_destroy_cq(struct ibv_cq *cq) { return ((int (*)(struct ibv_cq *))gv_fn[F_DESTROY_CQ])(cq); }

// ibv_req_notify_cq and ibv_poll_cq are inline in verbs.h: through ops.
static int gv_req_notify(struct ibv_cq *cq) { return cq->context->ops.req_notify_cq(cq, 0); }
static int gv_poll(struct ibv_cq *cq, int n, struct ibv_wc *wc) { return cq->context->ops.poll_cq(cq, n, wc); }

// One event from the channel: 0, EAGAIN when none is queued, or an errno.
static int gv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq *want) {
	struct ibv_cq *cq = NULL;
	void *ctx = NULL;
	errno = 0;
	if (((int (*)(struct ibv_comp_channel *, struct ibv_cq **, void **))gv_fn[F_GET_CQ_EVENT])(ch, &cq, &ctx))
		return errno == EWOULDBLOCK ? EAGAIN : (errno ? errno : EIO);
	return cq == want ? 0 : EPROTO;
}
static void gv_ack(struct ibv_cq *cq, unsigned n) { ((void (*)(struct ibv_cq *, unsigned))gv_fn[F_ACK_CQ_EVENTS])(cq, n); }

// A send work request as Go writes it; gv_post_send builds the ibv_send_wr
// chain from these.
typedef struct {
	uint64_t wr_id;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm;
	uint32_t opcode;
	uint32_t flags;
	uint32_t nsge;
	uint32_t pad;
} gv_wr;

// A QP and the memory its posts are built in: cap_wr requests of at most
// cap_sge scatter/gather entries in all, for each direction. bad is the
// index of the first request a failed post did not take.
typedef struct {
	struct ibv_qp *qp;
	int cap_wr, cap_ssge, cap_rsge, bad;
	gv_wr *sdesc;
	struct ibv_sge *ssge;
	struct ibv_send_wr *swr;
	gv_wr *rdesc;
	struct ibv_sge *rsge;
	struct ibv_recv_wr *rwr;
} gv_qp;

static gv_ptr gv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia, int cap_wr) {
	gv_qp *q = calloc(1, sizeof *q);
	gv_ptr r = {NULL, ENOMEM};
	if (!q) return r;
	q->cap_wr = cap_wr;
	q->cap_ssge = cap_wr * (ia->cap.max_send_sge ? ia->cap.max_send_sge : 1);
	q->cap_rsge = cap_wr * (ia->cap.max_recv_sge ? ia->cap.max_recv_sge : 1);
	q->sdesc = calloc(cap_wr, sizeof(gv_wr));
	q->rdesc = calloc(cap_wr, sizeof(gv_wr));
	q->swr = calloc(cap_wr, sizeof(struct ibv_send_wr));
	q->rwr = calloc(cap_wr, sizeof(struct ibv_recv_wr));
	q->ssge = calloc(q->cap_ssge, sizeof(struct ibv_sge));
	q->rsge = calloc(q->cap_rsge, sizeof(struct ibv_sge));
	if (q->sdesc && q->rdesc && q->swr && q->rwr && q->ssge && q->rsge) {
		errno = 0;
		q->qp = ((struct ibv_qp *(*)(struct ibv_pd *, struct ibv_qp_init_attr *))gv_fn[F_CREATE_QP])(pd, ia);
		r.err = q->qp ? 0 : (errno ? errno : EIO);
	}
	if (!q->qp) {
		free(q->sdesc); free(q->rdesc); free(q->swr); free(q->rwr); free(q->ssge); free(q->rsge); free(q);
		return r;
	}
	r.p = q;
	return r;
}

static int gv_destroy_qp(gv_qp *q) {
	int rc = ((int (*)(struct ibv_qp *))gv_fn[F_DESTROY_QP])(q->qp);
	if (rc == 0) {
		free(q->sdesc); free(q->rdesc); free(q->swr); free(q->rwr); free(q->ssge); free(q->rsge); free(q);
	}
	return rc;
}

static int gv_modify_qp(gv_qp *q, struct ibv_qp_attr *a, int mask) {
	return ((int (*)(struct ibv_qp *, struct ibv_qp_attr *, int))gv_fn[F_MODIFY_QP])(q->qp, a, mask);
}

static int gv_query_qp(gv_qp *q, struct ibv_qp_attr *a, int mask) {
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	return ((int (*)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *))gv_fn[F_QUERY_QP])(q->qp, a, mask, &ia);
}

// ibv_post_send, inline in verbs.h: the chain of the first n requests of
// sdesc, their entries consecutive in ssge.
static int gv_post_send(gv_qp *q, int n) {
	struct ibv_sge *sge = q->ssge;
	for (int i = 0; i < n; i++) {
		const gv_wr *d = &q->sdesc[i];
		struct ibv_send_wr *w = &q->swr[i];
		memset(w, 0, sizeof *w);
		w->wr_id = d->wr_id;
		w->next = i + 1 < n ? w + 1 : NULL;
		w->sg_list = d->nsge ? sge : NULL;
		w->num_sge = d->nsge;
		w->opcode = (enum ibv_wr_opcode)d->opcode;
		w->send_flags = d->flags;
		w->imm_data = htonl(d->imm);
		w->wr.rdma.remote_addr = d->raddr;
		w->wr.rdma.rkey = d->rkey;
		sge += d->nsge;
	}
	struct ibv_send_wr *bad = NULL;
	int rc = q->qp->context->ops.post_send(q->qp, q->swr, &bad);
	q->bad = rc == 0 ? n : (bad ? (int)(bad - q->swr) : 0);
	return rc;
}

static int gv_post_recv(gv_qp *q, int n) {
	struct ibv_sge *sge = q->rsge;
	for (int i = 0; i < n; i++) {
		const gv_wr *d = &q->rdesc[i];
		struct ibv_recv_wr *w = &q->rwr[i];
		w->wr_id = d->wr_id;
		w->next = i + 1 < n ? w + 1 : NULL;
		w->sg_list = d->nsge ? sge : NULL;
		w->num_sge = d->nsge;
		sge += d->nsge;
	}
	struct ibv_recv_wr *bad = NULL;
	int rc = q->qp->context->ops.post_recv(q->qp, q->rwr, &bad);
	q->bad = rc == 0 ? n : (bad ? (int)(bad - q->rwr) : 0);
	return rc;
}

static const char *gv_wc_status_str(int s) { return ((const char *(*)(int))gv_fn[F_WC_STATUS_STR])(s); }

// The ABI facts of ibv_layout.h, as this package declares them.
typedef struct { const char *name; long value; } gv_fact;
#define S(T) {"sizeof(struct " #T ")", (long)sizeof(struct T)},
#define O(T, F) {"offsetof(struct " #T ", " #F ")", (long)offsetof(struct T, F)},
#define K(N) {#N, (long)(N)},
static const gv_fact gv_facts[] = {
#include "ibv_layout.h"
};
#undef S
#undef O
#undef K
static int gv_nfacts(void) { return sizeof gv_facts / sizeof gv_facts[0]; }
static gv_fact gv_fact_at(int i) { return gv_facts[i]; }
*/
import "C"

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/internal/dl"
	"github.com/gccl/gccl/internal/spin"
)

// The Go mirrors of struct ibv_sge and struct ibv_wc have their sizes (and
// TestLayoutMatchesHeader checks every offset against verbs.h).
var (
	_ [unsafe.Sizeof(SGE{}) - C.sizeof_struct_ibv_sge]byte
	_ [C.sizeof_struct_ibv_sge - unsafe.Sizeof(SGE{})]byte
	_ [unsafe.Sizeof(WC{}) - C.sizeof_struct_ibv_wc]byte
	_ [C.sizeof_struct_ibv_wc - unsafe.Sizeof(WC{})]byte
)

// DefaultLibrary is the library Open loads unless GCCL_IBVERBS_LIBRARY
// names another.
const DefaultLibrary = "libibverbs.so.1"

// symbols are the entry points gccl resolves, in gv_fn's order. dlsym
// gives each one's default version (IBVERBS_1.1), the one a program linked
// against libibverbs today calls.
var symbols = [...]string{
	"ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device", "ibv_close_device",
	"ibv_query_device", "ibv_query_port", "ibv_query_gid", "ibv_alloc_pd", "ibv_dealloc_pd", "ibv_reg_mr", "ibv_dereg_mr",
	"ibv_create_comp_channel", "ibv_destroy_comp_channel", "ibv_create_cq", "ibv_destroy_cq", "ibv_get_cq_event",
	"ibv_ack_cq_events", "ibv_create_qp", "ibv_modify_qp", "ibv_query_qp", "ibv_destroy_qp", "ibv_wc_status_str",
}

var _ [len(symbols) - C.F_COUNT]byte // one name per slot
var _ [C.F_COUNT - len(symbols)]byte

var (
	loadOnce sync.Once
	loadErr  error
)

// load opens the library once; it stays loaded for the life of the
// process (its providers keep state and threads of their own).
func load() error {
	loadOnce.Do(func() {
		path := os.Getenv("GCCL_IBVERBS_LIBRARY")
		if path == "" {
			path = DefaultLibrary
		}
		lib, err := dl.Open(path)
		if err != nil {
			loadErr = fmt.Errorf("%w: cannot load %s (rdma-core's libibverbs1 and ibverbs-providers are not installed?): %v", ErrNotSupported, path, err)
			return
		}
		for i, name := range symbols {
			p := lib.Sym(name)
			if p == nil {
				lib.Close()
				loadErr = fmt.Errorf("%w: %s has no %s (an rdma-core older than gccl needs?)", ErrNotSupported, path, name)
				return
			}
			C.gv_set(C.int(i), p)
		}
	})
	return loadErr
}

// abiFacts returns the ABI facts of ibv_layout.h as this package declares
// them (for TestLayoutMatchesHeader).
func abiFacts() map[string]int64 {
	m := map[string]int64{}
	for i := range int(C.gv_nfacts()) {
		f := C.gv_fact_at(C.int(i))
		m[C.GoString(f.name)] = int64(f.value)
	}
	return m
}

// libStatusString is the loaded library's ibv_wc_status_str(s).
func libStatusString(s WCStatus) (string, error) {
	if err := load(); err != nil {
		return "", err
	}
	return C.GoString(C.gv_wc_status_str(C.int(s))), nil
}

func errno(rc C.int) error {
	if rc < 0 {
		rc = -rc
	}
	return syscall.Errno(rc)
}

// DeviceNames lists the devices libibverbs finds, in its order.
func DeviceNames() ([]string, error) {
	if err := load(); err != nil {
		return nil, err
	}
	buf := make([]byte, 64<<10)
	n := C.gv_device_names((*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf)))
	if n < 0 {
		return nil, &Error{Op: "ibv_get_device_list", Device: "libibverbs", Err: errno(n),
			Hint: "is the ib_uverbs kernel module loaded?"}
	}
	var names []string
	for i, s := 0, 0; i < int(n); i++ {
		e := s
		for buf[e] != 0 {
			e++
		}
		names = append(names, string(buf[s:e]))
		s = e + 1
	}
	return names, nil
}

// Context is an open device (struct ibv_context).
type Context struct {
	c    *C.struct_ibv_context
	name string
	attr DeviceAttr

	mu       sync.Mutex
	closed   bool
	children int // PDs and CQs
}

// Open opens the device called name ("mlx5_0", "rxe0").
func Open(name string) (*Context, error) {
	if err := load(); err != nil {
		return nil, err
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	r := C.gv_open(cname)
	if r.p == nil {
		e := &Error{Op: "ibv_open_device", Device: name, Err: errno(r.err)}
		if r.err == C.ENODEV {
			e.Hint = "libibverbs lists no such device; see ibv_devices"
		}
		return nil, e
	}
	c := &Context{c: (*C.struct_ibv_context)(r.p), name: name}
	var a C.struct_ibv_device_attr
	if rc := C.gv_query_device(c.c, &a); rc != 0 {
		C.gv_close_device(c.c)
		return nil, &Error{Op: "ibv_query_device", Device: name, Err: errno(rc)}
	}
	c.attr = DeviceAttr{
		FirmwareVersion: C.GoString(&a.fw_ver[0]),
		NodeGUID:        beUint64(uint64(a.node_guid)),
		VendorID:        uint32(a.vendor_id), VendorPartID: uint32(a.vendor_part_id),
		MaxMRSize: uint64(a.max_mr_size), MaxQP: int(a.max_qp), MaxQPWR: int(a.max_qp_wr), MaxSGE: int(a.max_sge),
		MaxCQ: int(a.max_cq), MaxCQE: int(a.max_cqe), MaxMR: int(a.max_mr), MaxPD: int(a.max_pd),
		MaxQPRdAtom: int(a.max_qp_rd_atom), MaxQPInitRdAtom: int(a.max_qp_init_rd_atom), Ports: int(a.phys_port_cnt),
	}
	live.contexts.Add(1)
	return c, nil
}

// beUint64 reads a big-endian 64-bit value held in host order.
func beUint64(v uint64) uint64 {
	var b [8]byte
	*(*uint64)(unsafe.Pointer(&b)) = v
	var r uint64
	for _, x := range b {
		r = r<<8 | uint64(x)
	}
	return r
}

// Name is the device's name.
func (c *Context) Name() string { return c.name }

// Attr returns the device's attributes, as queried at Open.
func (c *Context) Attr() DeviceAttr { return c.attr }

func (c *Context) use() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("%w: device %s", ErrClosed, c.name)
	}
	return nil
}

func (c *Context) adopt(d int) {
	c.mu.Lock()
	c.children += d
	c.mu.Unlock()
}

// QueryPort returns the attributes of port (1-based).
func (c *Context) QueryPort(port int) (PortAttr, error) {
	if err := c.use(); err != nil {
		return PortAttr{}, err
	}
	if port < 1 || port > 255 {
		return PortAttr{}, fmt.Errorf("%w: port %d of %s", ErrInvalidArgument, port, c.name)
	}
	var a C.struct_ibv_port_attr
	if rc := C.gv_query_port(c.c, C.uint8_t(port), &a); rc != 0 {
		return PortAttr{}, &Error{Op: fmt.Sprintf("ibv_query_port %d", port), Device: c.name, Err: errno(rc)}
	}
	return PortAttr{
		State: PortState(a.state), MaxMTU: MTU(a.max_mtu), ActiveMTU: MTU(a.active_mtu),
		GIDTableLen: int(a.gid_tbl_len), MaxMsgSize: uint32(a.max_msg_sz), LID: uint16(a.lid), SMLID: uint16(a.sm_lid),
		LinkLayer: LinkLayer(a.link_layer), ActiveWidth: uint8(a.active_width), ActiveSpeed: uint8(a.active_speed),
		PhysState: uint8(a.phys_state),
	}, nil
}

// QueryGID returns entry index of port's GID table.
func (c *Context) QueryGID(port, index int) (GID, error) {
	if err := c.use(); err != nil {
		return GID{}, err
	}
	var g C.union_ibv_gid
	if rc := C.gv_query_gid(c.c, C.uint8_t(port), C.int(index), &g); rc != 0 {
		return GID{}, &Error{Op: fmt.Sprintf("ibv_query_gid port %d index %d", port, index), Device: c.name, Err: errno(rc)}
	}
	return *(*GID)(unsafe.Pointer(&g)), nil
}

// Port checks that port is active and picks its GID as ChooseGID does with
// cfg.GIDIndex, from the GID table in sysfs (or, without it, from the
// device), checked against the device's own table.
func (c *Context) Port(port int, cfg Config) (Port, error) {
	a, err := c.activePort(port)
	if err != nil {
		return Port{}, err
	}
	entries := scanPort(fmt.Sprintf("/sys/class/infiniband/%s/ports/%d", c.name, port), port).GIDs
	if len(entries) == 0 {
		for i := range min(a.GIDTableLen, 256) {
			if g, err := c.QueryGID(port, i); err == nil && !g.IsZero() {
				entries = append(entries, GIDEntry{Index: i, GID: g})
			}
		}
	}
	e, err := ChooseGID(entries, a.LinkLayer, cfg.GIDIndex)
	if err != nil {
		return Port{}, fmt.Errorf("verbs: %s:%d: %s", c.name, port, strings.TrimPrefix(err.Error(), "verbs: "))
	}
	return c.portWith(port, a, e)
}

// CandidatePort is the port and GID that Select or Choose picked, after
// checking that the port is still active and the GID still in the
// device's table (without reading the whole table again).
func (c *Context) CandidatePort(cand Candidate) (Port, error) {
	if cand.Device != c.name {
		return Port{}, fmt.Errorf("%w: candidate %s is not a port of %s", ErrInvalidArgument, cand.Name(), c.name)
	}
	a, err := c.activePort(cand.Port.Num)
	if err != nil {
		return Port{}, err
	}
	return c.portWith(cand.Port.Num, a, cand.GID)
}

func (c *Context) activePort(port int) (PortAttr, error) {
	a, err := c.QueryPort(port)
	if err != nil {
		return PortAttr{}, err
	}
	if a.State != PortActive {
		return PortAttr{}, fmt.Errorf("verbs: %s:%d is %v, not ACTIVE (link down, or no subnet manager on InfiniBand)", c.name, port, a.State)
	}
	return a, nil
}

func (c *Context) portWith(port int, a PortAttr, e GIDEntry) (Port, error) {
	if g, err := c.QueryGID(port, e.Index); err != nil {
		return Port{}, err
	} else if g != e.GID {
		return Port{}, fmt.Errorf("verbs: %s:%d: GID %d is %v on the device, not %v (the table changed; choose again)", c.name, port, e.Index, g, e.GID)
	}
	return Port{Device: c.name, Num: port, Attr: a, GID: e}, nil
}

// Close closes the device; its PDs and CQs must be closed first.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.children > 0 {
		return fmt.Errorf("verbs: %s: close its %d PDs and CQs before the device", c.name, c.children)
	}
	if rc := C.gv_close_device(c.c); rc != 0 {
		return &Error{Op: "ibv_close_device", Device: c.name, Err: errno(rc)}
	}
	c.closed = true
	live.contexts.Add(-1)
	return nil
}

// PD is a protection domain: memory registered in it is accessible to its
// QPs only.
type PD struct {
	ctx *Context
	p   *C.struct_ibv_pd

	mu       sync.Mutex
	closed   bool
	children int // MRs and QPs
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	if err := c.use(); err != nil {
		return nil, err
	}
	r := C.gv_alloc_pd(c.c)
	if r.p == nil {
		return nil, &Error{Op: "ibv_alloc_pd", Device: c.name, Err: errno(r.err)}
	}
	c.adopt(1)
	live.pds.Add(1)
	return &PD{ctx: c, p: (*C.struct_ibv_pd)(r.p)}, nil
}

func (pd *PD) use() error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return fmt.Errorf("%w: PD of %s", ErrClosed, pd.ctx.name)
	}
	return nil
}

func (pd *PD) adopt(d int) {
	pd.mu.Lock()
	pd.children += d
	pd.mu.Unlock()
}

// Close frees the PD; its MRs and QPs must be closed first.
func (pd *PD) Close() error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil
	}
	if pd.children > 0 {
		return fmt.Errorf("verbs: %s: close the PD's %d MRs and QPs before it", pd.ctx.name, pd.children)
	}
	if rc := C.gv_dealloc_pd(pd.p); rc != 0 {
		return &Error{Op: "ibv_dealloc_pd", Device: pd.ctx.name, Err: errno(rc)}
	}
	pd.closed = true
	pd.ctx.adopt(-1)
	live.pds.Add(-1)
	return nil
}

// MR is a registered memory region: the device may read and write it, and
// peers may as its access rights allow, by its keys.
type MR struct {
	pd   *PD
	m    *C.struct_ibv_mr
	buf  []byte
	pin  runtime.Pinner
	addr uint64
	n    int
	lkey uint32
	rkey uint32

	mu     sync.Mutex
	closed bool
}

// Register registers b. The memory stays in place and referenced until
// Close (Go's heap does not move objects; b is pinned for the cgo rules).
func (pd *PD) Register(b []byte, access Access) (*MR, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: registering an empty buffer", ErrInvalidArgument)
	}
	m, err := pd.register(uintptr(unsafe.Pointer(&b[0])), len(b), access)
	if err != nil {
		return nil, err
	}
	m.buf = b
	m.pin.Pin(&b[0])
	return m, nil
}

// RegisterAddr registers n bytes at addr: memory gccl does not manage as
// a Go slice (a mapping, a shared segment, device memory with
// GPUDirect RDMA). The caller keeps it mapped until Close.
func (pd *PD) RegisterAddr(addr uintptr, n int, access Access) (*MR, error) {
	if n <= 0 || addr == 0 {
		return nil, fmt.Errorf("%w: registering %d bytes at %#x", ErrInvalidArgument, n, addr)
	}
	return pd.register(addr, n, access)
}

func (pd *PD) register(addr uintptr, n int, access Access) (*MR, error) {
	if err := pd.use(); err != nil {
		return nil, err
	}
	r := C.gv_reg_mr(pd.p, C.uintptr_t(addr), C.size_t(n), C.int(access))
	if r.p == nil {
		var lim unix.Rlimit
		unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
		return nil, &Error{Op: fmt.Sprintf("ibv_reg_mr of %d bytes at %#x", n, addr), Device: pd.ctx.name, Err: errno(r.err),
			Hint: regHint(uintptr(r.err), n, lim.Cur, lim.Cur == unix.RLIM_INFINITY)}
	}
	cm := (*C.struct_ibv_mr)(r.p)
	pd.adopt(1)
	live.mrs.Add(1)
	return &MR{pd: pd, m: cm, addr: uint64(addr), n: n, lkey: uint32(cm.lkey), rkey: uint32(cm.rkey)}, nil
}

// LKey is the key the local QPs' scatter/gather entries name the region by.
func (m *MR) LKey() uint32 { return m.lkey }

// RKey is the key peers name the region by in RDMA operations.
func (m *MR) RKey() uint32 { return m.rkey }

// Addr is the region's first byte's address.
func (m *MR) Addr() uint64 { return m.addr }

// Len is the region's length.
func (m *MR) Len() int { return m.n }

// Bytes is the registered slice (nil for RegisterAddr's regions).
func (m *MR) Bytes() []byte { return m.buf }

// SGE is the scatter/gather entry of n bytes at offset off of the region.
// It panics if the range is not inside the region, as slicing would.
func (m *MR) SGE(off, n int) SGE {
	if off < 0 || n < 0 || off+n > m.n || n > 1<<32-1 {
		panic(fmt.Sprintf("verbs: SGE [%d:%d] outside a region of %d bytes", off, off+n, m.n))
	}
	return SGE{Addr: m.addr + uint64(off), Length: uint32(n), LKey: m.lkey}
}

// Close deregisters the region.
func (m *MR) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	if rc := C.gv_dereg_mr(m.m); rc != 0 {
		return &Error{Op: "ibv_dereg_mr", Device: m.pd.ctx.name, Err: errno(rc)}
	}
	m.closed = true
	m.pin.Unpin()
	m.buf = nil
	m.pd.adopt(-1)
	live.mrs.Add(-1)
	return nil
}

// cqScratch is how many completions one poll of the device takes at most.
const cqScratch = 64

// ackBatch is how many channel events are acknowledged at once
// (ibv_ack_cq_events takes a lock; Close acknowledges the rest).
const ackBatch = 64

// CQ is a completion queue, with a completion channel when Wait is to
// sleep.
type CQ struct {
	ctx  *Context
	cq   *C.struct_ibv_cq
	ch   *C.struct_ibv_comp_channel
	size int

	mu      sync.Mutex // Poll
	scratch *C.struct_ibv_wc
	closed  atomic.Bool
	users   atomic.Int64 // QPs

	wmu     sync.Mutex // Wait
	file    *os.File   // a duplicate of the channel's descriptor, in Go's poller
	rc      syscall.RawConn
	readFn  func(uintptr) bool
	evErr   C.int
	armed   bool
	unacked C.uint
	events  uint64 // channel events taken (tests)
}

// CreateCQ creates a completion queue of at least size entries; with
// channel, a completion channel lets Wait sleep until a completion comes.
func (c *Context) CreateCQ(size int, channel bool) (*CQ, error) {
	if err := c.use(); err != nil {
		return nil, err
	}
	if size < 1 || c.attr.MaxCQE > 0 && size > c.attr.MaxCQE {
		return nil, fmt.Errorf("%w: a CQ of %d entries (%s takes 1 to %d)", ErrInvalidArgument, size, c.name, c.attr.MaxCQE)
	}
	cq := &CQ{ctx: c}
	if channel {
		r := C.gv_create_channel(c.c)
		if r.p == nil {
			return nil, &Error{Op: "ibv_create_comp_channel", Device: c.name, Err: errno(r.err)}
		}
		cq.ch = (*C.struct_ibv_comp_channel)(r.p)
		fd, err := unix.FcntlInt(uintptr(cq.ch.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			C.gv_destroy_channel(cq.ch)
			return nil, &Error{Op: "dup of the completion channel", Device: c.name, Err: err}
		}
		cq.file = os.NewFile(uintptr(fd), "ibv-comp-channel")
		if cq.rc, err = cq.file.SyscallConn(); err != nil {
			cq.file.Close()
			C.gv_destroy_channel(cq.ch)
			return nil, &Error{Op: "completion channel", Device: c.name, Err: err}
		}
		cq.readFn = cq.onReadable
	}
	r := C.gv_create_cq(c.c, C.int(size), cq.ch)
	if r.p == nil {
		if cq.ch != nil {
			cq.file.Close()
			C.gv_destroy_channel(cq.ch)
		}
		return nil, &Error{Op: fmt.Sprintf("ibv_create_cq of %d entries", size), Device: c.name, Err: errno(r.err)}
	}
	cq.cq = (*C.struct_ibv_cq)(r.p)
	cq.size = int(cq.cq.cqe)
	cq.scratch = (*C.struct_ibv_wc)(C.calloc(cqScratch, C.sizeof_struct_ibv_wc))
	c.adopt(1)
	live.cqs.Add(1)
	return cq, nil
}

// Size is the number of entries the CQ has (at least what was asked).
func (cq *CQ) Size() int { return cq.size }

// Device is the name of the CQ's device.
func (cq *CQ) Device() string { return cq.ctx.name }

// Poll takes up to len(wcs) completions, without waiting, and returns how
// many it took. Keep wcs across calls: Poll allocates nothing.
func (cq *CQ) Poll(wcs []WC) (int, error) {
	cq.mu.Lock()
	if cq.closed.Load() {
		cq.mu.Unlock()
		return 0, ErrClosed
	}
	total := 0
	for total < len(wcs) {
		want := min(len(wcs)-total, cqScratch)
		n := int(C.gv_poll(cq.cq, C.int(want), cq.scratch))
		if n < 0 {
			cq.mu.Unlock()
			return total, &Error{Op: "ibv_poll_cq", Device: cq.ctx.name, Err: syscall.EIO}
		}
		got := wcs[total : total+n]
		copy(got, unsafe.Slice((*WC)(unsafe.Pointer(cq.scratch)), n))
		for i := range got {
			got[i].fixImm()
		}
		total += n
		if n < want {
			break
		}
	}
	cq.mu.Unlock()
	return total, nil
}

// Check returns nil for a successful completion, and for a failed one an
// error naming the device, the QP, the work request and the status.
func (cq *CQ) Check(wc *WC) error { return wcError(cq.ctx.name, wc) }

// Wait returns the next completions, up to len(wcs): it polls, spins a
// little while none has come, then sleeps on the completion channel (a CQ
// without one keeps polling, with short sleeps) until one comes, the
// deadline passes (an error wrapping ErrTimeout; a zero deadline waits
// forever) or the CQ is closed.
func (cq *CQ) Wait(wcs []WC, deadline time.Time) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	cq.wmu.Lock()
	defer cq.wmu.Unlock()
	var b spin.Backoff
	for {
		n, err := cq.Poll(wcs)
		if n > 0 || err != nil {
			return n, err
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return 0, cq.timeout()
		}
		if b.Spin() {
			continue
		}
		if cq.file == nil {
			time.Sleep(50 * time.Microsecond)
			continue
		}
		if !cq.armed {
			// Ask for an event at the next completion, then poll once
			// more: one may have come before the request.
			if rc := C.gv_req_notify(cq.cq); rc != 0 {
				return 0, &Error{Op: "ibv_req_notify_cq", Device: cq.ctx.name, Err: errno(rc)}
			}
			cq.armed = true
			continue
		}
		cq.file.SetReadDeadline(deadline)
		err = cq.rc.Read(cq.readFn)
		took := err == nil && cq.evErr == 0
		if took {
			cq.armed = false
			cq.took()
		}
		if cq.closed.Load() {
			return 0, ErrClosed
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, cq.timeout()
		}
		if err != nil {
			return 0, &Error{Op: "wait on the completion channel", Device: cq.ctx.name, Err: err}
		}
		if !took {
			return 0, &Error{Op: "ibv_get_cq_event", Device: cq.ctx.name, Err: errno(cq.evErr)}
		}
	}
}

// Arm asks the completion channel for one event at the CQ's next
// completion (ibv_req_notify_cq), for WaitEvent. A completion that came
// before Arm raises no event: poll once after it. Arm and WaitEvent are
// for a caller that polls the CQ itself and needs another goroutine only
// to sleep on the channel; do not mix them with Wait.
func (cq *CQ) Arm() error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed.Load() {
		return ErrClosed
	}
	if cq.ch == nil {
		return fmt.Errorf("%w: %s: the CQ has no completion channel", ErrInvalidArgument, cq.ctx.name)
	}
	if rc := C.gv_req_notify(cq.cq); rc != 0 {
		return &Error{Op: "ibv_req_notify_cq", Device: cq.ctx.name, Err: errno(rc)}
	}
	return nil
}

// WaitEvent sleeps until the completion channel has an event (one Arm
// asked for), the deadline passes (an error wrapping ErrTimeout; zero
// waits forever) or the CQ is closed (ErrClosed). It takes and
// acknowledges the event but no completion: poll after it.
func (cq *CQ) WaitEvent(deadline time.Time) error {
	if cq.file == nil {
		return fmt.Errorf("%w: %s: the CQ has no completion channel", ErrInvalidArgument, cq.ctx.name)
	}
	cq.wmu.Lock()
	defer cq.wmu.Unlock()
	if cq.closed.Load() {
		return ErrClosed
	}
	cq.file.SetReadDeadline(deadline)
	err := cq.rc.Read(cq.readFn)
	took := err == nil && cq.evErr == 0
	if took {
		cq.took()
	}
	switch {
	case cq.closed.Load():
		return ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		return cq.timeout()
	case err != nil:
		return &Error{Op: "wait on the completion channel", Device: cq.ctx.name, Err: err}
	case !took:
		return &Error{Op: "ibv_get_cq_event", Device: cq.ctx.name, Err: errno(cq.evErr)}
	}
	return nil
}

// took counts an event taken from the channel, for acknowledgement: even
// when Close is under way, since ibv_destroy_cq waits until every event
// that was taken is acknowledged (cq.wmu held).
func (cq *CQ) took() {
	cq.events++
	if cq.unacked++; cq.unacked >= ackBatch {
		C.gv_ack(cq.cq, cq.unacked)
		cq.unacked = 0
	}
}

func (cq *CQ) timeout() error {
	return fmt.Errorf("%w: %s: no completion before the deadline", ErrTimeout, cq.ctx.name)
}

// onReadable takes one event from the channel when the poller says it is
// readable; false: none was queued after all.
func (cq *CQ) onReadable(uintptr) bool {
	rc := C.gv_get_cq_event(cq.ch, cq.cq)
	if rc == C.EAGAIN {
		return false
	}
	cq.evErr = rc
	return true
}

// Close destroys the CQ (and its channel), ending a Wait in progress; the
// QPs using it must be closed first.
func (cq *CQ) Close() error {
	if n := cq.users.Load(); n > 0 {
		return fmt.Errorf("verbs: %s: close the %d QPs using the CQ before it", cq.ctx.name, n)
	}
	if cq.closed.Swap(true) {
		return nil
	}
	if cq.file != nil {
		cq.file.Close() // wakes a Wait asleep on it
	}
	cq.wmu.Lock()
	defer cq.wmu.Unlock()
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.unacked > 0 {
		C.gv_ack(cq.cq, cq.unacked)
		cq.unacked = 0
	}
	if rc := C.gv_destroy_cq(cq.cq); rc != 0 {
		return &Error{Op: "ibv_destroy_cq", Device: cq.ctx.name, Err: errno(rc)}
	}
	if cq.ch != nil {
		if rc := C.gv_destroy_channel(cq.ch); rc != 0 {
			return &Error{Op: "ibv_destroy_comp_channel", Device: cq.ctx.name, Err: errno(rc)}
		}
	}
	C.free(unsafe.Pointer(cq.scratch))
	cq.ctx.adopt(-1)
	live.cqs.Add(-1)
	return nil
}

// QP is a reliable-connected queue pair.
type QP struct {
	pd     *PD
	q      *C.gv_qp
	qpn    uint32
	port   Port
	local  Local
	caps   QPCaps
	sendCQ *CQ
	recvCQ *CQ

	mmu   sync.Mutex // modifications
	m     qpMachine
	state atomic.Uint32

	smu    sync.Mutex // PostSend
	sdesc  []C.gv_wr
	ssge   []SGE
	rmu    sync.Mutex // PostRecv
	rdesc  []C.gv_wr
	rsge   []SGE
	batch  int
	closed bool // under smu and rmu
}

// CreateQP creates an RC QP on o.Port and moves it to INIT, where receives
// may be posted before it is connected.
func (pd *PD) CreateQP(o QPOptions) (*QP, error) {
	if err := pd.use(); err != nil {
		return nil, err
	}
	dev := pd.ctx.name
	if o.SendCQ == nil || o.RecvCQ == nil {
		return nil, fmt.Errorf("%w: a QP needs a send and a receive CQ", ErrInvalidArgument)
	}
	if o.Port.Device != dev || o.Port.Num < 1 {
		return nil, fmt.Errorf("%w: the QP's port %s:%d is not a port of %s (use Context.Port)", ErrInvalidArgument, o.Port.Device, o.Port.Num, dev)
	}
	if o.Port.GID.Index > 255 {
		return nil, fmt.Errorf("%w: GID index %d of %s:%d: a QP's address takes indexes 0-255 (set GCCL_IB_GID_INDEX)",
			ErrInvalidArgument, o.Port.GID.Index, dev, o.Port.Num)
	}
	if o.SendCQ.ctx != pd.ctx || o.RecvCQ.ctx != pd.ctx {
		return nil, fmt.Errorf("%w: the QP's CQs belong to another device context", ErrInvalidArgument)
	}
	def := func(v, d int) int {
		if v <= 0 {
			return d
		}
		return v
	}
	o.MaxSendWR, o.MaxRecvWR = def(o.MaxSendWR, 128), def(o.MaxRecvWR, 128)
	o.MaxSendSGE, o.MaxRecvSGE = def(o.MaxSendSGE, 4), def(o.MaxRecvSGE, 4)
	o.PostBatch = def(o.PostBatch, 64)
	if o.Access == 0 {
		o.Access = AccessAll
	}
	a := pd.ctx.attr
	if a.MaxQPWR > 0 && max(o.MaxSendWR, o.MaxRecvWR) > a.MaxQPWR || a.MaxSGE > 0 && max(o.MaxSendSGE, o.MaxRecvSGE) > a.MaxSGE {
		return nil, fmt.Errorf("%w: %s takes at most %d requests of %d entries per queue; asked %d/%d requests of %d/%d",
			ErrInvalidArgument, dev, a.MaxQPWR, a.MaxSGE, o.MaxSendWR, o.MaxRecvWR, o.MaxSendSGE, o.MaxRecvSGE)
	}
	var ia C.struct_ibv_qp_init_attr
	ia.send_cq, ia.recv_cq = o.SendCQ.cq, o.RecvCQ.cq
	ia.qp_type = C.IBV_QPT_RC
	ia.cap.max_send_wr, ia.cap.max_recv_wr = C.uint32_t(o.MaxSendWR), C.uint32_t(o.MaxRecvWR)
	ia.cap.max_send_sge, ia.cap.max_recv_sge = C.uint32_t(o.MaxSendSGE), C.uint32_t(o.MaxRecvSGE)
	ia.cap.max_inline_data = C.uint32_t(o.MaxInline)
	r := C.gv_create_qp(pd.p, &ia, C.int(o.PostBatch))
	if r.p == nil {
		return nil, &Error{Op: "ibv_create_qp", Device: dev, Err: errno(r.err)}
	}
	q := &QP{pd: pd, q: (*C.gv_qp)(r.p), port: o.Port, sendCQ: o.SendCQ, recvCQ: o.RecvCQ, batch: o.PostBatch}
	q.qpn = uint32(q.q.qp.qp_num)
	q.caps = QPCaps{int(ia.cap.max_send_wr), int(ia.cap.max_recv_wr), int(ia.cap.max_send_sge), int(ia.cap.max_recv_sge), int(ia.cap.max_inline_data)}
	// The caps may exceed what was asked; the scratch holds what was.
	q.caps.MaxSendSGE, q.caps.MaxRecvSGE = min(q.caps.MaxSendSGE, o.MaxSendSGE), min(q.caps.MaxRecvSGE, o.MaxRecvSGE)
	q.sdesc = unsafe.Slice(q.q.sdesc, o.PostBatch)
	q.rdesc = unsafe.Slice(q.q.rdesc, o.PostBatch)
	q.ssge = unsafe.Slice((*SGE)(unsafe.Pointer(q.q.ssge)), int(q.q.cap_ssge))
	q.rsge = unsafe.Slice((*SGE)(unsafe.Pointer(q.q.rsge)), int(q.q.cap_rsge))
	q.m.modify = q.modify
	q.local = Local{
		Endpoint: Endpoint{
			QPN: q.qpn, PSN: rand.Uint32N(1 << 24), LID: o.Port.Attr.LID, GID: o.Port.GID.GID,
			MTU: o.Port.Attr.ActiveMTU, LinkLayer: o.Port.Attr.LinkLayer, RdAtomic: uint8(min(max(a.MaxQPRdAtom, 1), 16)),
		},
		Port: uint8(o.Port.Num), GIDIndex: uint8(o.Port.GID.Index), MaxRdAtomic: uint8(min(max(a.MaxQPInitRdAtom, 1), 16)),
	}
	if err := q.m.apply(InitAttr(uint8(o.Port.Num), o.Access)); err != nil {
		C.gv_destroy_qp(q.q)
		return nil, q.wrap(err)
	}
	q.state.Store(uint32(q.m.state))
	pd.adopt(1)
	o.SendCQ.users.Add(1)
	o.RecvCQ.users.Add(1)
	live.qps.Add(1)
	return q, nil
}

// wrap gives a state-machine error the QP's identity.
func (q *QP) wrap(err error) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return &Error{Op: "QP", Device: q.pd.ctx.name, QPN: q.qpn, Err: err}
}

// QPN is the QP's number.
func (q *QP) QPN() uint32 { return q.qpn }

// State is the state gccl last moved the QP to (Query asks the device).
func (q *QP) State() QPState { return QPState(q.state.Load()) }

// Caps are the QP's limits.
func (q *QP) Caps() QPCaps { return q.caps }

// Device is the name of the QP's device.
func (q *QP) Device() string { return q.pd.ctx.name }

// Endpoint is what the peer's QP needs to connect to this one.
func (q *QP) Endpoint() Endpoint { return q.local.Endpoint }

// Connect moves the QP from INIT through RTR to RTS, connected to the
// peer's QP remote, with the timeouts and retries of cfg. The peer must
// have moved its own QP to RTR (or be about to) before this side sends:
// exchange Endpoints, Connect on both sides, then agree (a barrier on the
// bootstrap) before the first post.
func (q *QP) Connect(remote Endpoint, cfg Config) error {
	q.mmu.Lock()
	defer q.mmu.Unlock()
	err := q.m.connect(q.local, remote, cfg)
	q.state.Store(uint32(q.m.state))
	if err != nil {
		return q.wrap(err)
	}
	return nil
}

// Modify makes one checked transition (CheckTransition) with attributes a.
func (q *QP) Modify(a QPAttr) error {
	q.mmu.Lock()
	defer q.mmu.Unlock()
	err := q.m.apply(a)
	q.state.Store(uint32(q.m.state))
	if err != nil {
		return q.wrap(err)
	}
	return nil
}

// Flush moves the QP to ERR: its outstanding and later work requests
// complete with WCFlushErr (errors.Is(CQ.Check(wc), ErrFlushed)). That is
// how a transfer in flight is cancelled and how a QP is drained before
// Close.
func (q *QP) Flush() error { return q.Modify(StateAttr(QPErr)) }

// modify is ibv_modify_qp with a's fields.
func (q *QP) modify(a QPAttr) error {
	if q.closed {
		return ErrClosed
	}
	var c C.struct_ibv_qp_attr
	c.qp_state = uint32(a.State)
	c.pkey_index = C.uint16_t(a.PKeyIndex)
	c.port_num = C.uint8_t(a.Port)
	c.qp_access_flags = C.uint(a.Access)
	c.path_mtu = uint32(a.PathMTU)
	c.dest_qp_num = C.uint32_t(a.DestQPN)
	c.rq_psn = C.uint32_t(a.RQPSN)
	c.max_dest_rd_atomic = C.uint8_t(a.MaxDestRdAtomic)
	c.min_rnr_timer = C.uint8_t(a.MinRNRTimer)
	c.timeout = C.uint8_t(a.Timeout)
	c.retry_cnt = C.uint8_t(a.RetryCnt)
	c.rnr_retry = C.uint8_t(a.RNRRetry)
	c.sq_psn = C.uint32_t(a.SQPSN)
	c.max_rd_atomic = C.uint8_t(a.MaxRdAtomic)
	h := &c.ah_attr
	h.is_global = 0
	if a.AH.IsGlobal {
		h.is_global = 1
	}
	*(*GID)(unsafe.Pointer(&h.grh.dgid)) = a.AH.DGID
	h.grh.sgid_index = C.uint8_t(a.AH.SGIDIndex)
	h.grh.hop_limit = C.uint8_t(a.AH.HopLimit)
	h.grh.traffic_class = C.uint8_t(a.AH.TrafficClass)
	h.grh.flow_label = C.uint32_t(a.AH.FlowLabel)
	h.dlid = C.uint16_t(a.AH.DLID)
	h.sl = C.uint8_t(a.AH.SL)
	h.port_num = C.uint8_t(a.AH.Port)
	if rc := C.gv_modify_qp(q.q, &c, C.int(a.Mask)); rc != 0 {
		e := &Error{Op: "ibv_modify_qp to " + a.State.String(), Device: q.pd.ctx.name, QPN: q.qpn, Err: errno(rc)}
		if a.State == QPRTR {
			e.Hint = "check the peer's endpoint: " + a.String()
		}
		return e
	}
	return nil
}

// Query asks the device for the QP's attributes (ibv_query_qp): its state
// and those set by the transitions.
func (q *QP) Query() (QPAttr, error) {
	q.mmu.Lock()
	defer q.mmu.Unlock()
	if q.closed {
		return QPAttr{}, ErrClosed
	}
	mask := AttrState | AttrAccessFlags | AttrPKeyIndex | AttrPort | AttrAV | AttrPathMTU | AttrTimeout | AttrRetryCnt |
		AttrRNRRetry | AttrRQPSN | AttrMaxQPRdAtomic | AttrMinRNRTimer | AttrSQPSN | AttrMaxDestRdAtomc | AttrDestQPN
	var c C.struct_ibv_qp_attr
	if rc := C.gv_query_qp(q.q, &c, C.int(mask)); rc != 0 {
		return QPAttr{}, &Error{Op: "ibv_query_qp", Device: q.pd.ctx.name, QPN: q.qpn, Err: errno(rc)}
	}
	h := &c.ah_attr
	return QPAttr{
		Mask: mask, State: QPState(c.qp_state), PKeyIndex: uint16(c.pkey_index), Port: uint8(c.port_num),
		Access: Access(c.qp_access_flags), PathMTU: MTU(c.path_mtu), DestQPN: uint32(c.dest_qp_num), RQPSN: uint32(c.rq_psn),
		MaxDestRdAtomic: uint8(c.max_dest_rd_atomic), MinRNRTimer: uint8(c.min_rnr_timer),
		AH: AHAttr{
			IsGlobal: h.is_global != 0, DGID: *(*GID)(unsafe.Pointer(&h.grh.dgid)), SGIDIndex: uint8(h.grh.sgid_index),
			HopLimit: uint8(h.grh.hop_limit), TrafficClass: uint8(h.grh.traffic_class), FlowLabel: uint32(h.grh.flow_label),
			DLID: uint16(h.dlid), SL: uint8(h.sl), Port: uint8(h.port_num),
		},
		Timeout: uint8(c.timeout), RetryCnt: uint8(c.retry_cnt), RNRRetry: uint8(c.rnr_retry), SQPSN: uint32(c.sq_psn),
		MaxRdAtomic: uint8(c.max_rd_atomic),
	}, nil
}

// PostSend posts wrs in order, as chains of up to QPOptions.PostBatch
// requests. Only requests with SendSignaled produce a completion (but an
// error completes any request). The memory of the requests' SGEs must
// stay registered, and unchanged for WRITE and SEND, until their
// completion (or a later signaled one of the QP) is polled; SendInline
// requests' memory is free when PostSend returns. It allocates nothing.
func (q *QP) PostSend(wrs []SendWR) error {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.closed {
		return ErrClosed
	}
	if s := QPState(q.state.Load()); s != QPRTS && s != QPErr {
		return q.postStateError(s)
	}
	for done := 0; done < len(wrs); {
		n := min(len(wrs)-done, q.batch)
		k := 0
		for i := range n {
			w := &wrs[done+i]
			ns := len(w.SGEs)
			if ns > q.caps.MaxSendSGE || w.Op > OpRead {
				return q.badSend(done, done+i, ns, w.Op)
			}
			if w.Flags&SendInline != 0 {
				total := 0
				for _, s := range w.SGEs {
					total += int(s.Length)
				}
				if total > q.caps.MaxInline {
					return q.badInline(done, done+i, total)
				}
			}
			d := &q.sdesc[i]
			d.wr_id = C.uint64_t(w.ID)
			d.raddr = C.uint64_t(w.RemoteAddr)
			d.rkey = C.uint32_t(w.RKey)
			d.imm = C.uint32_t(w.Imm)
			d.opcode = C.uint32_t(w.Op)
			d.flags = C.uint32_t(w.Flags)
			d.nsge = C.uint32_t(ns)
			copy(q.ssge[k:k+ns], w.SGEs)
			k += ns
		}
		if rc := C.gv_post_send(q.q, C.int(n)); rc != 0 {
			return q.postError("ibv_post_send", rc, done+int(q.q.bad))
		}
		done += n
	}
	return nil
}

// PostRecv posts receive requests in order. It allocates nothing.
func (q *QP) PostRecv(wrs []RecvWR) error {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if q.closed {
		return ErrClosed
	}
	if s := QPState(q.state.Load()); s == QPReset {
		return q.postStateError(s)
	}
	for done := 0; done < len(wrs); {
		n := min(len(wrs)-done, q.batch)
		k := 0
		for i := range n {
			w := &wrs[done+i]
			ns := len(w.SGEs)
			if ns > q.caps.MaxRecvSGE {
				return q.badRecv(done, done+i, ns)
			}
			d := &q.rdesc[i]
			d.wr_id = C.uint64_t(w.ID)
			d.nsge = C.uint32_t(ns)
			copy(q.rsge[k:k+ns], w.SGEs)
			k += ns
		}
		if rc := C.gv_post_recv(q.q, C.int(n)); rc != 0 {
			return q.postError("ibv_post_recv", rc, done+int(q.q.bad))
		}
		done += n
	}
	return nil
}

// The error paths of the posts, apart so that the posts allocate nothing.
// posted counts the requests of earlier batches, which went to the device;
// i is the refused request (its batch was not posted).

func (q *QP) postStateError(s QPState) error {
	return &PostError{Err: &Error{Op: "post", Device: q.pd.ctx.name, QPN: q.qpn,
		Err: fmt.Errorf("%w: the QP is in %v", ErrInvalidArgument, s), Hint: "Connect it first"}}
}

func (q *QP) badSend(posted, i, nsge int, op Opcode) error {
	return &PostError{Posted: posted, Err: &Error{Op: "ibv_post_send", Device: q.pd.ctx.name, QPN: q.qpn,
		Err: fmt.Errorf("%w: work request %d: %v with %d SGEs (the QP takes %d)", ErrInvalidArgument, i, op, nsge, q.caps.MaxSendSGE)}}
}

func (q *QP) badInline(posted, i, n int) error {
	return &PostError{Posted: posted, Err: &Error{Op: "ibv_post_send", Device: q.pd.ctx.name, QPN: q.qpn,
		Err: fmt.Errorf("%w: work request %d: %d bytes inline (the QP takes %d; QPOptions.MaxInline)", ErrInvalidArgument, i, n, q.caps.MaxInline)}}
}

func (q *QP) badRecv(posted, i, nsge int) error {
	return &PostError{Posted: posted, Err: &Error{Op: "ibv_post_recv", Device: q.pd.ctx.name, QPN: q.qpn,
		Err: fmt.Errorf("%w: work request %d: %d SGEs (the QP takes %d)", ErrInvalidArgument, i, nsge, q.caps.MaxRecvSGE)}}
}

func (q *QP) postError(op string, rc C.int, posted int) error {
	e := &Error{Op: op, Device: q.pd.ctx.name, QPN: q.qpn, Err: errno(rc)}
	if rc == C.ENOMEM {
		e.Hint = "the queue is full: more requests outstanding than the QP's MaxSendWR/MaxRecvWR; poll completions first"
	}
	return &PostError{Posted: posted, Err: e}
}

// Close destroys the QP; its unfinished work requests are dropped without
// completions (Flush first and poll them to see each one end).
func (q *QP) Close() error {
	q.mmu.Lock()
	defer q.mmu.Unlock()
	q.smu.Lock()
	defer q.smu.Unlock()
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if q.closed {
		return nil
	}
	if rc := C.gv_destroy_qp(q.q); rc != 0 {
		return &Error{Op: "ibv_destroy_qp", Device: q.pd.ctx.name, QPN: q.qpn, Err: errno(rc)}
	}
	q.closed = true
	q.sdesc, q.rdesc, q.ssge, q.rsge = nil, nil, nil, nil
	q.sendCQ.users.Add(-1)
	q.recvCQ.users.Add(-1)
	q.pd.adopt(-1)
	live.qps.Add(-1)
	return nil
}
