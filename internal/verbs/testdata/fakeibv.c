// A fake libibverbs.so.1 for gccl's tests on machines without an RDMA
// device: it exports the entry points internal/verbs resolves, with
// rdma-core's ABI (the declarations of ../ibv_abi.h, so that the binding's
// inline calls through context->ops land here), and moves bytes with a
// "NIC" thread inside the process. It is built by the tests with gcc
// -shared (internal/verbs/verbstest) and loaded through
// GCCL_IBVERBS_LIBRARY.
//
//   - One device, "fakeibv0" (GCCL_FAKE_IBV_DEVICES=0: none), one port,
//     ACTIVE, InfiniBand link layer, LID 1, one GID (fe80::<pid>).
//   - RC QPs connect by QP number within the process: two agents of one
//     process talk through it, as two processes would through a NIC. A
//     peer QP that is gone completes the requester's work with "transport
//     retry counter exceeded", as a dead remote NIC would after its retries.
//   - The NIC thread runs the posted work requests in posting order, in
//     chunks of 64 KiB, checking the local keys (LOC_PROT_ERR) and the
//     remote key, access and bounds (REM_ACCESS_ERR: the requester's QP goes
//     to ERR and its later work is flushed), as a NIC does. A SEND or WRITE
//     with immediate consumes a receive of the peer QP; without one it waits
//     (RNR, retried forever). Moving a QP to ERR flushes its queued work and
//     receives (WR_FLUSH_ERR, a completion for each, signaled or not); a
//     chunk being copied finishes first, so a WRITE may land in part.
//   - ibv_dereg_mr and ibv_destroy_qp wait for a chunk in progress: once
//     they return the fake NIC no longer touches the memory.
//   - Send-queue slots are freed when a later signaled completion of the QP
//     is polled, as on hardware; posting past MaxSendWR is ENOMEM.
//   - Memory registration: ibv_reg_mr of host addresses, and
//     ibv_reg_dmabuf_mr, which maps the dma-buf descriptor at the offset
//     given (the fake CUDA driver's dma-bufs are memfds), its addresses
//     starting at iova.
//
// Knobs, read from the environment when used:
//   GCCL_FAKE_IBV_STALL_FILE  while this file exists the NIC moves nothing
//   GCCL_FAKE_IBV_RATE        bytes per second the NIC moves (0: unlimited)
//   GCCL_FAKE_IBV_NO_DMABUF=1 ibv_reg_dmabuf_mr fails with EOPNOTSUPP
//   GCCL_FAKE_IBV_NO_PEERMEM=1 ibv_reg_mr of the fake CUDA driver's device
//                             memory (a "fakecuda" memfd mapping) fails with
//                             EFAULT, as without nvidia-peermem
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../ibv_abi.h"

struct ibv_device { char name[64]; };

#define MAX_QP 1024
#define MAX_MR 65536
#define MAX_SGE 32
#define CHUNK (64 << 10)
#define QPN_BASE 0x100

struct fmr {
	struct ibv_mr mr;
	int used;
	uint32_t key;
	uint64_t iova;   // addresses WRs use
	char *host;      // where they are in this process
	size_t len;
	int access;
	void *map;       // dma-buf mapping
	size_t maplen;
};

struct fcq {
	struct ibv_cq cq;
	pthread_mutex_t mu;
	struct cqent { struct ibv_wc wc; uint32_t qpn; uint64_t seq; int send; } *ring;
	int cap, head, n, armed;
};

struct fch { struct ibv_comp_channel ch; int wfd; struct fcq *cq; };

struct frecv { uint64_t wr_id; int nsge; struct ibv_sge sge[MAX_SGE]; };

struct fqp {
	struct ibv_qp qp;
	int used, busy;
	uint32_t dest;
	struct fcq *scq, *rcq;
	int max_send, max_recv, max_sge;
	uint64_t posted, released; // send work requests posted; freed by polled completions
	struct frecv *recvs;
	int rhead, rn;
	struct ibv_qp_attr attr;
};

struct work {
	struct work *next;
	uint32_t qpn;
	uint64_t seq, wr_id, raddr;
	int opcode, flags, nsge;
	uint32_t imm, rkey;
	struct ibv_sge sge[MAX_SGE];
	size_t total, done;
	char *inl; // inline data
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;   // tables, queues
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pthread_rwlock_t dma = PTHREAD_RWLOCK_INITIALIZER; // held (read) while the NIC copies
static struct fqp *qps[MAX_QP];
static struct fmr *mrs[MAX_MR];
static uint32_t keygen;
static struct work *qhead, *qtail;
static pthread_t nic;
static int nic_started;
static struct ibv_device devs[1] = {{"fakeibv0"}};

static int env_on(const char *k) { const char *v = getenv(k); return v && v[0] == '1'; }

static struct fqp *qp_of(uint32_t qpn) {
	if (qpn < QPN_BASE || qpn >= QPN_BASE + MAX_QP) return NULL;
	struct fqp *q = qps[qpn - QPN_BASE];
	return q && q->used ? q : NULL;
}

static struct fmr *mr_of(uint32_t key) {
	struct fmr *m = mrs[(key >> 8) % MAX_MR];
	return m && m->used && m->key == key ? m : NULL;
}

// addr of n bytes under key, in pd, with access; NULL if not allowed.
static char *resolve(uint32_t key, uint64_t addr, size_t n, struct ibv_pd *pd, int need) {
	struct fmr *m = mr_of(key);
	if (!m || m->mr.pd != pd || (m->access & need) != need) return NULL;
	if (addr < m->iova || addr + n < addr || addr + n > m->iova + m->len) return NULL;
	return m->host + (addr - m->iova);
}

static void cq_add(struct fcq *cq, struct ibv_wc *wc, uint32_t qpn, uint64_t seq, int send) {
	pthread_mutex_lock(&cq->mu);
	if (cq->n == cq->cap) {
		fprintf(stderr, "fakeibv: CQ overflow (%d entries)\n", cq->cap);
		pthread_mutex_unlock(&cq->mu);
		return;
	}
	struct cqent *e = &cq->ring[(cq->head + cq->n) % cq->cap];
	e->wc = *wc;
	e->qpn = qpn;
	e->seq = seq;
	e->send = send;
	cq->n++;
	int ev = cq->armed;
	cq->armed = 0;
	pthread_mutex_unlock(&cq->mu);
	if (ev && cq->cq.channel) {
		struct fch *ch = (struct fch *)cq->cq.channel;
		char b = 1;
		if (write(ch->wfd, &b, 1) < 0) {}
	}
}

static int wc_opcode(int op) {
	switch (op) {
	case IBV_WR_RDMA_WRITE: case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
	}
	return IBV_WC_SEND;
}

// complete w on its QP's send CQ with status st (every error completes).
static void complete(struct fqp *q, struct work *w, int st) {
	if (st == IBV_WC_SUCCESS && !(w->flags & IBV_SEND_SIGNALED)) return;
	struct ibv_wc wc;
	memset(&wc, 0, sizeof wc);
	wc.wr_id = w->wr_id;
	wc.status = st;
	wc.opcode = wc_opcode(w->opcode);
	wc.qp_num = q->qp.qp_num;
	wc.byte_len = w->total;
	cq_add(q->scq, &wc, q->qp.qp_num, w->seq, 1);
}

static void flush_recvs(struct fqp *q) {
	while (q->rn > 0) {
		struct frecv *r = &q->recvs[q->rhead];
		struct ibv_wc wc;
		memset(&wc, 0, sizeof wc);
		wc.wr_id = r->wr_id;
		wc.status = IBV_WC_WR_FLUSH_ERR;
		wc.opcode = IBV_WC_RECV;
		wc.qp_num = q->qp.qp_num;
		q->rhead = (q->rhead + 1) % q->max_recv;
		q->rn--;
		cq_add(q->rcq, &wc, q->qp.qp_num, 0, 0);
	}
}

static void to_error(struct fqp *q) {
	q->qp.state = IBV_QPS_ERR;
	q->attr.qp_state = IBV_QPS_ERR;
	flush_recvs(q);
}

// unlink w (after prev, or the head) from the queue and free it.
static void drop(struct work *prev, struct work *w) {
	if (prev) prev->next = w->next; else qhead = w->next;
	if (qtail == w) qtail = prev;
	free(w->inl);
	free(w);
}

static int stalled(void) {
	const char *f = getenv("GCCL_FAKE_IBV_STALL_FILE");
	return f && f[0] && access(f, F_OK) == 0;
}

static void pace(size_t n) {
	const char *r = getenv("GCCL_FAKE_IBV_RATE");
	long rate = r ? atol(r) : 0;
	if (rate > 0) {
		long ns = (long)((double)n / rate * 1e9);
		struct timespec ts = {ns / 1000000000, ns % 1000000000};
		nanosleep(&ts, NULL);
	}
}

// The pieces of k bytes at offset off of an SGE list, checked against the
// local keys; -1 if a key does not allow it.
struct piece { char *p; size_t n; };
static int pieces(struct ibv_sge *sge, int nsge, size_t off, size_t k, struct ibv_pd *pd, int need, struct piece *out) {
	int np = 0;
	for (int i = 0; i < nsge && k > 0; i++) {
		if (off >= sge[i].length) { off -= sge[i].length; continue; }
		size_t c = sge[i].length - off;
		if (c > k) c = k;
		char *p = resolve(sge[i].lkey, sge[i].addr + off, c, pd, need);
		if (!p) return -1;
		out[np].p = p;
		out[np++].n = c;
		k -= c;
		off = 0;
	}
	return k ? -1 : np;
}

static void fill_recv_wc(struct ibv_wc *wc, struct frecv *rv, struct fqp *r, struct fqp *q, int op, size_t n, uint32_t imm) {
	memset(wc, 0, sizeof *wc);
	wc->wr_id = rv->wr_id;
	wc->opcode = op;
	wc->byte_len = n;
	wc->qp_num = r->qp.qp_num;
	wc->src_qp = q->qp.qp_num;
	if (op == IBV_WC_RECV_RDMA_WITH_IMM || imm) {
		wc->wc_flags = IBV_WC_WITH_IMM;
		wc->imm_data = imm;
	}
}

enum { BLOCKED, MOVED, DONE };

// One step of work request w (after prev in the queue), called with mu
// held: DONE when it finished (and was dropped), MOVED when a chunk moved,
// BLOCKED when it waits for a receive at the peer (RNR).
static int step(struct work *prev, struct work *w) {
	struct fqp *q = qp_of(w->qpn);
	if (!q) { drop(prev, w); return DONE; } // destroyed
	if (q->qp.state == IBV_QPS_ERR) { complete(q, w, IBV_WC_WR_FLUSH_ERR); drop(prev, w); return DONE; }
	struct fqp *r = qp_of(q->dest);
	int fail = 0;
	if (!r || r->qp.state < IBV_QPS_RTR) fail = IBV_WC_RETRY_EXC_ERR;
	else if (r->qp.state == IBV_QPS_ERR || r->dest != q->qp.qp_num) fail = IBV_WC_RETRY_EXC_ERR;
	if (fail) { complete(q, w, fail); to_error(q); drop(prev, w); return DONE; }
	int op = w->opcode;
	struct piece pcs[MAX_SGE];
	if (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) {
		if (r->rn == 0) return BLOCKED; // RNR: the peer has no receive posted
		struct frecv *rv = &r->recvs[r->rhead];
		int np = w->inl ? 0 : pieces(w->sge, w->nsge, 0, w->total, q->qp.pd, 0, pcs);
		if (np < 0) { complete(q, w, IBV_WC_LOC_PROT_ERR); to_error(q); drop(prev, w); return DONE; }
		struct piece dst[MAX_SGE];
		int nd = pieces(rv->sge, rv->nsge, 0, w->total, r->qp.pd, IBV_ACCESS_LOCAL_WRITE, dst);
		r->rhead = (r->rhead + 1) % r->max_recv;
		r->rn--;
		struct ibv_wc wc;
		fill_recv_wc(&wc, rv, r, q, IBV_WC_RECV, w->total, op == IBV_WR_SEND_WITH_IMM ? w->imm : 0);
		if (nd < 0) {
			wc.status = IBV_WC_LOC_LEN_ERR;
			cq_add(r->rcq, &wc, r->qp.qp_num, 0, 0);
			to_error(r);
			complete(q, w, IBV_WC_REM_INV_REQ_ERR);
			to_error(q);
			drop(prev, w);
			return DONE;
		}
		// Gather into the scatter list.
		size_t si = 0, so = 0;
		char *src = w->inl;
		for (int i = 0; i < nd; i++) {
			size_t need = dst[i].n, doff = 0;
			while (need > 0) {
				if (src) {
					memcpy(dst[i].p + doff, src, need);
					src += need; doff += need; need = 0;
					break;
				}
				size_t c = pcs[si].n - so;
				if (c > need) c = need;
				memcpy(dst[i].p + doff, pcs[si].p + so, c);
				doff += c; need -= c; so += c;
				if (so == pcs[si].n) { si++; so = 0; }
			}
		}
		cq_add(r->rcq, &wc, r->qp.qp_num, 0, 0);
		complete(q, w, IBV_WC_SUCCESS);
		drop(prev, w);
		return DONE;
	}
	int read = op == IBV_WR_RDMA_READ;
	int need = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	if (w->done == 0 && !resolve(w->rkey, w->raddr, w->total, r->qp.pd, need)) {
		complete(q, w, IBV_WC_REM_ACCESS_ERR); to_error(q); drop(prev, w); return DONE;
	}
	if (w->done < w->total) {
		size_t k = w->total - w->done;
		if (k > CHUNK) k = CHUNK;
		size_t off = w->done;
		// Resolve under mu; copy outside it (posts go on) under dma, which
		// ibv_dereg_mr takes for writing once the region is out of the
		// table: a copy in progress ends before it returns.
		pthread_rwlock_rdlock(&dma);
		char *remote = resolve(w->rkey, w->raddr + off, k, r->qp.pd, need);
		int np = w->inl ? 0 : pieces(w->sge, w->nsge, off, k, q->qp.pd, read ? IBV_ACCESS_LOCAL_WRITE : 0, pcs);
		if (!remote || np < 0) {
			pthread_rwlock_unlock(&dma);
			complete(q, w, !remote ? IBV_WC_REM_ACCESS_ERR : IBV_WC_LOC_PROT_ERR);
			to_error(q);
			drop(prev, w);
			return DONE;
		}
		q->busy = 1;
		pthread_mutex_unlock(&mu);
		if (w->inl) memcpy(remote, w->inl + off, k);
		for (int i = 0; i < np; i++) {
			if (read) memcpy(pcs[i].p, remote, pcs[i].n);
			else memcpy(remote, pcs[i].p, pcs[i].n);
			remote += pcs[i].n;
		}
		pthread_rwlock_unlock(&dma);
		pace(k);
		pthread_mutex_lock(&mu);
		q->busy = 0;
		pthread_cond_broadcast(&cv);
		w->done += k;
		if (w->done < w->total) return MOVED;
		return MOVED; // the completion comes on the next step, after a look at the QP's state
	}
	if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
		if (r->rn == 0) return BLOCKED;
		struct frecv *rv = &r->recvs[r->rhead];
		r->rhead = (r->rhead + 1) % r->max_recv;
		r->rn--;
		struct ibv_wc wc;
		fill_recv_wc(&wc, rv, r, q, IBV_WC_RECV_RDMA_WITH_IMM, w->total, w->imm);
		cq_add(r->rcq, &wc, r->qp.qp_num, 0, 0);
	}
	complete(q, w, IBV_WC_SUCCESS);
	drop(prev, w);
	return DONE;
}

static void *nic_main(void *arg) {
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (!qhead) pthread_cond_wait(&cv, &mu);
		if (stalled()) {
			pthread_mutex_unlock(&mu);
			usleep(1000);
			pthread_mutex_lock(&mu);
			continue;
		}
		// The first work request that can move, in posting order; one
		// waiting for a receive (RNR) holds back only its own QP's later
		// work, as per-QP order requires.
		struct work *prev = NULL, *w = qhead;
		uint32_t blocked[64];
		int nb = 0, moved = 0;
		while (w) {
			int skip = 0;
			for (int i = 0; i < nb; i++) skip |= blocked[i] == w->qpn;
			if (!skip) {
				struct work *next = w->next;
				int st = step(prev, w);
				if (st != BLOCKED) { moved = 1; break; }
				if (nb < 64) blocked[nb++] = w->qpn;
				(void)next;
			}
			prev = w;
			w = w->next;
		}
		if (!moved) {
			pthread_mutex_unlock(&mu);
			usleep(200);
			pthread_mutex_lock(&mu);
		}
	}
	return NULL;
}

// ---- the library's entry points ----

struct ibv_device **ibv_get_device_list(int *n) {
	const char *d = getenv("GCCL_FAKE_IBV_DEVICES");
	int k = d && d[0] == '0' ? 0 : 1;
	struct ibv_device **l = calloc(k + 1, sizeof *l);
	if (!l) { errno = ENOMEM; return NULL; }
	for (int i = 0; i < k; i++) l[i] = &devs[i];
	if (n) *n = k;
	return l;
}
void ibv_free_device_list(struct ibv_device **l) { free(l); }
const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }

static int f_poll(struct ibv_cq *ibcq, int n, struct ibv_wc *wc);
static int f_notify(struct ibv_cq *ibcq, int solicited);
static int f_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int f_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

struct ibv_context *ibv_open_device(struct ibv_device *d) {
	struct ibv_context *c = calloc(1, sizeof *c);
	if (!c) { errno = ENOMEM; return NULL; }
	c->device = d;
	c->ops.poll_cq = f_poll;
	c->ops.req_notify_cq = f_notify;
	c->ops.post_send = f_post_send;
	c->ops.post_recv = f_post_recv;
	c->cmd_fd = -1;
	c->async_fd = -1;
	c->num_comp_vectors = 1;
	pthread_mutex_lock(&mu);
	if (!nic_started) {
		nic_started = 1;
		pthread_create(&nic, NULL, nic_main, NULL);
		pthread_detach(nic);
	}
	pthread_mutex_unlock(&mu);
	return c;
}
int ibv_close_device(struct ibv_context *c) { free(c); return 0; }

int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) {
	(void)c;
	memset(a, 0, sizeof *a);
	strcpy(a->fw_ver, "fake-1");
	a->node_guid = 0x0102030405060708ull;
	a->max_mr_size = (uint64_t)1 << 40;
	a->vendor_id = 0xfa4e;
	a->max_qp = MAX_QP;
	a->max_qp_wr = 16384;
	a->max_sge = MAX_SGE;
	a->max_sge_rd = MAX_SGE;
	a->max_cq = 4096;
	a->max_cqe = 1 << 20;
	a->max_mr = MAX_MR;
	a->max_pd = 4096;
	a->max_qp_rd_atom = 16;
	a->max_qp_init_rd_atom = 16;
	a->phys_port_cnt = 1;
	return 0;
}

int ibv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
	(void)c;
	if (port != 1) return EINVAL;
	memset(a, 0, sizeof *a);
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = 1;
	a->max_msg_sz = 1u << 31;
	a->lid = 1;
	a->link_layer = IBV_LINK_LAYER_INFINIBAND;
	a->phys_state = 5;
	a->active_width = 2;
	a->active_speed = 32;
	return 0;
}

int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *g) {
	(void)c;
	if (port != 1 || index != 0) { errno = EINVAL; return -1; }
	memset(g, 0, sizeof *g);
	g->raw[0] = 0xfe;
	g->raw[1] = 0x80;
	uint32_t pid = getpid();
	memcpy(&g->raw[12], &pid, 4);
	g->raw[8] = 0x02;
	return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *c) {
	struct ibv_pd *pd = calloc(1, sizeof *pd);
	if (!pd) { errno = ENOMEM; return NULL; }
	pd->context = c;
	return pd;
}
int ibv_dealloc_pd(struct ibv_pd *pd) { free(pd); return 0; }

static int fakecuda_memory(uint64_t addr, size_t n) {
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f) return 0;
	char line[512];
	int hit = 0;
	while (fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && addr < hi && addr + n > lo && strstr(line, "memfd:fakecuda")) hit = 1;
	}
	fclose(f);
	return hit;
}

static struct ibv_mr *add_mr(struct ibv_pd *pd, char *host, uint64_t iova, size_t len, int access, void *map, size_t maplen) {
	struct fmr *m = calloc(1, sizeof *m);
	if (!m) { errno = ENOMEM; return NULL; }
	pthread_mutex_lock(&mu);
	int slot = -1;
	for (int i = 1; i < MAX_MR; i++) {
		int j = (keygen + i) % MAX_MR;
		if (j && !mrs[j]) { slot = j; break; }
	}
	if (slot < 0) { pthread_mutex_unlock(&mu); free(m); errno = ENOMEM; return NULL; }
	keygen = slot;
	static uint8_t gen;
	gen++;
	m->used = 1;
	m->key = (uint32_t)slot << 8 | gen;
	m->iova = iova;
	m->host = host;
	m->len = len;
	m->access = access;
	m->map = map;
	m->maplen = maplen;
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = (void *)(uintptr_t)iova;
	m->mr.length = len;
	m->mr.lkey = m->mr.rkey = m->key;
	mrs[slot] = m;
	pthread_mutex_unlock(&mu);
	return &m->mr;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
	if (!addr || !len) { errno = EINVAL; return NULL; }
	if (env_on("GCCL_FAKE_IBV_NO_PEERMEM") && fakecuda_memory((uintptr_t)addr, len)) { errno = EFAULT; return NULL; }
	return add_mr(pd, addr, (uintptr_t)addr, len, access, NULL, 0);
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd, int access) {
	if (env_on("GCCL_FAKE_IBV_NO_DMABUF")) { errno = EOPNOTSUPP; return NULL; }
	if (!len || fd < 0) { errno = EINVAL; return NULL; }
	uint64_t lo = offset & ~(uint64_t)4095;
	size_t maplen = len + (offset - lo);
	void *m = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, lo);
	if (m == MAP_FAILED) return NULL;
	struct ibv_mr *mr = add_mr(pd, (char *)m + (offset - lo), iova, len, access, m, maplen);
	if (!mr) munmap(m, maplen);
	return mr;
}

int ibv_dereg_mr(struct ibv_mr *ibmr) {
	struct fmr *m = (struct fmr *)ibmr;
	pthread_mutex_lock(&mu);
	mrs[(m->key >> 8) % MAX_MR] = NULL;
	m->used = 0;
	pthread_mutex_unlock(&mu);
	pthread_rwlock_wrlock(&dma); // a copy in progress ends first
	pthread_rwlock_unlock(&dma);
	if (m->map) munmap(m->map, m->maplen);
	free(m);
	return 0;
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c) {
	struct fch *ch = calloc(1, sizeof *ch);
	int p[2];
	if (!ch || pipe2(p, O_CLOEXEC) != 0) { free(ch); return NULL; }
	ch->ch.context = c;
	ch->ch.fd = p[0];
	ch->wfd = p[1];
	return &ch->ch;
}
int ibv_destroy_comp_channel(struct ibv_comp_channel *c) {
	struct fch *ch = (struct fch *)c;
	close(ch->ch.fd);
	close(ch->wfd);
	free(ch);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch, int vec) {
	(void)vec;
	if (cqe < 1 || cqe > (1 << 20)) { errno = EINVAL; return NULL; }
	struct fcq *cq = calloc(1, sizeof *cq);
	if (!cq || !(cq->ring = calloc(cqe, sizeof *cq->ring))) { free(cq); errno = ENOMEM; return NULL; }
	cq->cap = cqe;
	cq->cq.context = c;
	cq->cq.channel = ch;
	cq->cq.cq_context = ctx;
	cq->cq.cqe = cqe;
	pthread_mutex_init(&cq->mu, NULL);
	if (ch) ((struct fch *)ch)->cq = cq;
	return &cq->cq;
}
int ibv_destroy_cq(struct ibv_cq *ibcq) {
	struct fcq *cq = (struct fcq *)ibcq;
	free(cq->ring);
	free(cq);
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *c, struct ibv_cq **cq, void **ctx) {
	struct fch *ch = (struct fch *)c;
	char b;
	ssize_t r = read(ch->ch.fd, &b, 1);
	if (r != 1) { if (r == 0) errno = EIO; return -1; }
	*cq = &ch->cq->cq;
	*ctx = ch->cq->cq.cq_context;
	return 0;
}
void ibv_ack_cq_events(struct ibv_cq *cq, unsigned n) { (void)cq; (void)n; }

static int f_notify(struct ibv_cq *ibcq, int solicited) {
	(void)solicited;
	struct fcq *cq = (struct fcq *)ibcq;
	pthread_mutex_lock(&cq->mu);
	cq->armed = 1;
	pthread_mutex_unlock(&cq->mu);
	return 0;
}

static int f_poll(struct ibv_cq *ibcq, int n, struct ibv_wc *wc) {
	struct fcq *cq = (struct fcq *)ibcq;
	int k = 0;
	struct { uint32_t qpn; uint64_t seq; } rel[64];
	int nrel = 0;
	pthread_mutex_lock(&cq->mu);
	while (k < n && cq->n > 0) {
		struct cqent *e = &cq->ring[cq->head];
		wc[k++] = e->wc;
		if (e->send && nrel < 64) { rel[nrel].qpn = e->qpn; rel[nrel].seq = e->seq; nrel++; }
		cq->head = (cq->head + 1) % cq->cap;
		cq->n--;
		if (nrel == 64) break;
	}
	pthread_mutex_unlock(&cq->mu);
	if (nrel) {
		pthread_mutex_lock(&mu);
		for (int i = 0; i < nrel; i++) {
			struct fqp *q = qp_of(rel[i].qpn);
			if (q && rel[i].seq > q->released) q->released = rel[i].seq;
		}
		pthread_mutex_unlock(&mu);
	}
	return k;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia) {
	if (ia->qp_type != IBV_QPT_RC || !ia->send_cq || !ia->recv_cq) { errno = EINVAL; return NULL; }
	if (ia->cap.max_send_wr > 16384 || ia->cap.max_recv_wr > 16384 || ia->cap.max_send_sge > MAX_SGE || ia->cap.max_recv_sge > MAX_SGE) {
		errno = EINVAL;
		return NULL;
	}
	struct fqp *q = calloc(1, sizeof *q);
	if (!q) { errno = ENOMEM; return NULL; }
	q->max_send = ia->cap.max_send_wr ? ia->cap.max_send_wr : 1;
	q->max_recv = ia->cap.max_recv_wr ? ia->cap.max_recv_wr : 1;
	q->max_sge = MAX_SGE;
	if (!(q->recvs = calloc(q->max_recv, sizeof *q->recvs))) { free(q); errno = ENOMEM; return NULL; }
	q->scq = (struct fcq *)ia->send_cq;
	q->rcq = (struct fcq *)ia->recv_cq;
	q->qp.context = pd->context;
	q->qp.qp_context = ia->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = ia->send_cq;
	q->qp.recv_cq = ia->recv_cq;
	q->qp.qp_type = IBV_QPT_RC;
	q->qp.state = IBV_QPS_RESET;
	pthread_mutex_lock(&mu);
	int slot = -1;
	for (int i = 0; i < MAX_QP; i++) if (!qps[i]) { slot = i; break; }
	if (slot < 0) { pthread_mutex_unlock(&mu); free(q->recvs); free(q); errno = ENOMEM; return NULL; }
	q->used = 1;
	q->qp.qp_num = QPN_BASE + slot;
	qps[slot] = q;
	pthread_mutex_unlock(&mu);
	ia->cap.max_inline_data = ia->cap.max_inline_data > 256 ? ia->cap.max_inline_data : 256;
	return &q->qp;
}

int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask) {
	struct fqp *q = (struct fqp *)ibqp;
	pthread_mutex_lock(&mu);
	if (mask & IBV_QP_STATE) {
		int to = a->qp_state;
		int from = q->qp.state;
		int ok = to == IBV_QPS_ERR || to == IBV_QPS_RESET ||
			(from == IBV_QPS_RESET && to == IBV_QPS_INIT) || (from == IBV_QPS_INIT && (to == IBV_QPS_INIT || to == IBV_QPS_RTR)) ||
			(from == IBV_QPS_RTR && to == IBV_QPS_RTS) || (from == IBV_QPS_RTS && to == IBV_QPS_RTS);
		if (!ok) { pthread_mutex_unlock(&mu); return EINVAL; }
		if (to == IBV_QPS_RTR) {
			if (!(mask & IBV_QP_DEST_QPN)) { pthread_mutex_unlock(&mu); return EINVAL; }
			q->dest = a->dest_qp_num;
		}
		struct ibv_qp_attr keep = q->attr;
		q->attr = *a;
		if (!(mask & IBV_QP_DEST_QPN)) q->attr.dest_qp_num = keep.dest_qp_num;
		if (!(mask & IBV_QP_PORT)) q->attr.port_num = keep.port_num;
		if (!(mask & IBV_QP_ACCESS_FLAGS)) q->attr.qp_access_flags = keep.qp_access_flags;
		if (!(mask & IBV_QP_PATH_MTU)) q->attr.path_mtu = keep.path_mtu;
		if (!(mask & IBV_QP_AV)) q->attr.ah_attr = keep.ah_attr;
		if (!(mask & IBV_QP_RQ_PSN)) q->attr.rq_psn = keep.rq_psn;
		if (!(mask & IBV_QP_SQ_PSN)) q->attr.sq_psn = keep.sq_psn;
		if (!(mask & IBV_QP_TIMEOUT)) q->attr.timeout = keep.timeout;
		if (!(mask & IBV_QP_RETRY_CNT)) q->attr.retry_cnt = keep.retry_cnt;
		if (!(mask & IBV_QP_RNR_RETRY)) q->attr.rnr_retry = keep.rnr_retry;
		if (!(mask & IBV_QP_MAX_QP_RD_ATOMIC)) q->attr.max_rd_atomic = keep.max_rd_atomic;
		if (!(mask & IBV_QP_MAX_DEST_RD_ATOMIC)) q->attr.max_dest_rd_atomic = keep.max_dest_rd_atomic;
		if (!(mask & IBV_QP_MIN_RNR_TIMER)) q->attr.min_rnr_timer = keep.min_rnr_timer;
		if (!(mask & IBV_QP_PKEY_INDEX)) q->attr.pkey_index = keep.pkey_index;
		q->qp.state = to;
		if (to == IBV_QPS_ERR) to_error(q);
		if (to == IBV_QPS_RESET) { q->rn = 0; q->rhead = 0; q->posted = q->released = 0; }
		pthread_cond_broadcast(&cv);
	}
	pthread_mutex_unlock(&mu);
	return 0;
}

int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *ia) {
	(void)mask;
	struct fqp *q = (struct fqp *)ibqp;
	pthread_mutex_lock(&mu);
	*a = q->attr;
	a->qp_state = q->qp.state;
	a->cur_qp_state = q->qp.state;
	pthread_mutex_unlock(&mu);
	if (ia) memset(ia, 0, sizeof *ia);
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *ibqp) {
	struct fqp *q = (struct fqp *)ibqp;
	pthread_mutex_lock(&mu);
	while (q->busy) pthread_cond_wait(&cv, &mu);
	qps[q->qp.qp_num - QPN_BASE] = NULL;
	q->used = 0;
	// Its queued work goes without completions, as ibv_destroy_qp drops it.
	struct work **pp = &qhead, *last = NULL;
	while (*pp) {
		if ((*pp)->qpn == q->qp.qp_num) {
			struct work *w = *pp;
			*pp = w->next;
			free(w->inl);
			free(w);
		} else {
			last = *pp;
			pp = &(*pp)->next;
		}
	}
	qtail = last;
	pthread_mutex_unlock(&mu);
	free(q->recvs);
	free(q);
	return 0;
}

static int f_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
	struct fqp *q = (struct fqp *)ibqp;
	pthread_mutex_lock(&mu);
	for (; wr; wr = wr->next) {
		int rc = 0;
		if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR) rc = EINVAL;
		else if (wr->num_sge < 0 || wr->num_sge > MAX_SGE || wr->opcode > IBV_WR_RDMA_READ) rc = EINVAL;
		else if (q->posted - q->released >= (uint64_t)q->max_send) rc = ENOMEM;
		struct work *w = rc ? NULL : calloc(1, sizeof *w);
		if (!rc && !w) rc = ENOMEM;
		if (rc) { *bad = wr; pthread_mutex_unlock(&mu); return rc; }
		w->qpn = q->qp.qp_num;
		w->seq = ++q->posted;
		w->wr_id = wr->wr_id;
		w->opcode = wr->opcode;
		w->flags = wr->send_flags;
		w->imm = wr->imm_data;
		w->raddr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		w->nsge = wr->num_sge;
		for (int i = 0; i < wr->num_sge; i++) { w->sge[i] = wr->sg_list[i]; w->total += wr->sg_list[i].length; }
		if (wr->send_flags & IBV_SEND_INLINE) {
			w->inl = malloc(w->total ? w->total : 1);
			char *p = w->inl;
			for (int i = 0; i < wr->num_sge; i++) { memcpy(p, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length); p += wr->sg_list[i].length; }
		}
		if (qtail) qtail->next = w; else qhead = w;
		qtail = w;
	}
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	return 0;
}

static int f_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
	struct fqp *q = (struct fqp *)ibqp;
	pthread_mutex_lock(&mu);
	for (; wr; wr = wr->next) {
		if (q->qp.state == IBV_QPS_RESET || wr->num_sge > MAX_SGE || q->rn == q->max_recv) {
			*bad = wr;
			pthread_mutex_unlock(&mu);
			return q->rn == q->max_recv ? ENOMEM : EINVAL;
		}
		struct frecv *r = &q->recvs[(q->rhead + q->rn) % q->max_recv];
		r->wr_id = wr->wr_id;
		r->nsge = wr->num_sge;
		memcpy(r->sge, wr->sg_list, wr->num_sge * sizeof *r->sge);
		q->rn++;
		if (q->qp.state == IBV_QPS_ERR) flush_recvs(q);
	}
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	return 0;
}

const char *ibv_wc_status_str(int s) {
	static const char *names[] = {
		"success", "local length error", "local QP operation error", "local EE context operation error",
		"local protection error", "Work Request Flushed Error", "memory management operation error",
		"bad response error", "local access error", "remote invalid request error", "remote access error",
		"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
	};
	return s >= 0 && s < (int)(sizeof names / sizeof names[0]) ? names[s] : "unknown";
}
