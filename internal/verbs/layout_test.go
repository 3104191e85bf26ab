//go:build linux && cgo

package verbs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// headerFacts compiles ibv_layout.h against the installed
// <infiniband/verbs.h> (GCCL_IBVERBS_INCLUDE names another include
// directory) and returns the numbers it prints; it skips t where there is
// no header or no C compiler.
func headerFacts(t *testing.T) map[string]int64 {
	t.Helper()
	inc := os.Getenv("GCCL_IBVERBS_INCLUDE")
	if inc == "" {
		inc = "/usr/include"
	}
	header := filepath.Join(inc, "infiniband/verbs.h")
	if _, err := os.Stat(header); err != nil {
		t.Skipf("no %s to check gccl's declarations against (apt-get install libibverbs-dev; tests/rxe/run.sh does)", header)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to compile verbs.h", cc)
	}
	pkg, err := os.Getwd()
	require.NoError(t, err)
	dir := t.TempDir()
	src := filepath.Join(dir, "facts.c")
	require.NoError(t, os.WriteFile(src, []byte(`#include <stdio.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#define S(T) printf("sizeof(struct " #T ")=%ld\n", (long)sizeof(struct T));
#define O(T, F) printf("offsetof(struct " #T ", " #F ")=%ld\n", (long)offsetof(struct T, F));
#define K(N) printf(#N "=%ld\n", (long)(N));
int main(void) {
#include "ibv_layout.h"
	return 0;
}
`), 0o644))
	bin := filepath.Join(dir, "facts")
	out, err := exec.Command(cc, "-o", bin, "-I"+pkg, "-I"+inc, src).CombinedOutput()
	require.NoError(t, err, "compiling ibv_layout.h against %s:\n%s", header, out)
	out, err = exec.Command(bin).Output()
	require.NoError(t, err)
	facts := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		require.True(t, ok, sc.Text())
		n, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
		facts[k] = n
	}
	return facts
}

// TestLayoutMatchesHeader checks every size, offset and constant gccl
// declares in ibv_abi.h (and mirrors in Go) against rdma-core's verbs.h.
func TestLayoutMatchesHeader(t *testing.T) {
	if os.Getenv("RXEVM") == "1" {
		t.Skip("checked on the host (tests/rxe/run.sh runs it there first): compiling in the emulated VM is slow")
	}
	real := headerFacts(t)
	mine := abiFacts()
	require.Len(t, real, len(mine), "ibv_layout.h gave a different number of facts")
	var bad []string
	for k, v := range mine {
		if r, ok := real[k]; !ok || r != v {
			bad = append(bad, fmt.Sprintf("%s: gccl %d, verbs.h %d", k, v, r))
		}
	}
	require.Empty(t, bad, "ibv_abi.h disagrees with verbs.h")

	// The Go mirrors and constants.
	var wc WC
	var sge SGE
	goFacts := map[string]int64{
		"sizeof(struct ibv_wc)":                   int64(unsafe.Sizeof(wc)),
		"offsetof(struct ibv_wc, wr_id)":          int64(unsafe.Offsetof(wc.WRID)),
		"offsetof(struct ibv_wc, status)":         int64(unsafe.Offsetof(wc.Status)),
		"offsetof(struct ibv_wc, opcode)":         int64(unsafe.Offsetof(wc.Opcode)),
		"offsetof(struct ibv_wc, vendor_err)":     int64(unsafe.Offsetof(wc.VendorErr)),
		"offsetof(struct ibv_wc, byte_len)":       int64(unsafe.Offsetof(wc.ByteLen)),
		"offsetof(struct ibv_wc, imm_data)":       int64(unsafe.Offsetof(wc.Imm)),
		"offsetof(struct ibv_wc, qp_num)":         int64(unsafe.Offsetof(wc.QPNum)),
		"offsetof(struct ibv_wc, src_qp)":         int64(unsafe.Offsetof(wc.SrcQP)),
		"offsetof(struct ibv_wc, wc_flags)":       int64(unsafe.Offsetof(wc.Flags)),
		"offsetof(struct ibv_wc, pkey_index)":     int64(unsafe.Offsetof(wc.PKeyIndex)),
		"offsetof(struct ibv_wc, slid)":           int64(unsafe.Offsetof(wc.SLID)),
		"offsetof(struct ibv_wc, sl)":             int64(unsafe.Offsetof(wc.SL)),
		"offsetof(struct ibv_wc, dlid_path_bits)": int64(unsafe.Offsetof(wc.DLIDBits)),
		"sizeof(struct ibv_sge)":                  int64(unsafe.Sizeof(sge)),
		"offsetof(struct ibv_sge, addr)":          int64(unsafe.Offsetof(sge.Addr)),
		"offsetof(struct ibv_sge, length)":        int64(unsafe.Offsetof(sge.Length)),
		"offsetof(struct ibv_sge, lkey)":          int64(unsafe.Offsetof(sge.LKey)),
		"IBV_MTU_256":                             int64(MTU256),
		"IBV_MTU_4096":                            int64(MTU4096),
		"IBV_PORT_DOWN":                           int64(PortDown),
		"IBV_PORT_ACTIVE":                         int64(PortActive),
		"IBV_LINK_LAYER_INFINIBAND":               int64(LinkInfiniBand),
		"IBV_LINK_LAYER_ETHERNET":                 int64(LinkEthernet),
		"IBV_WC_SUCCESS":                          int64(WCSuccess),
		"IBV_WC_WR_FLUSH_ERR":                     int64(WCFlushErr),
		"IBV_WC_REM_ACCESS_ERR":                   int64(WCRemAccessErr),
		"IBV_WC_RETRY_EXC_ERR":                    int64(WCRetryExcErr),
		"IBV_WC_GENERAL_ERR":                      int64(WCGeneralErr),
		"IBV_WC_TM_RNDV_INCOMPLETE":               int64(len(wcStatusNames) - 1),
		"IBV_WC_SEND":                             int64(WCSend),
		"IBV_WC_RDMA_WRITE":                       int64(WCWrite),
		"IBV_WC_RDMA_READ":                        int64(WCRead),
		"IBV_WC_RECV":                             int64(WCRecv),
		"IBV_WC_RECV_RDMA_WITH_IMM":               int64(WCRecvRDMAWithImm),
		"IBV_WC_WITH_IMM":                         int64(WCWithImm),
		"IBV_ACCESS_LOCAL_WRITE":                  int64(AccessLocalWrite),
		"IBV_ACCESS_REMOTE_WRITE":                 int64(AccessRemoteWrite),
		"IBV_ACCESS_REMOTE_READ":                  int64(AccessRemoteRead),
		"IBV_ACCESS_REMOTE_ATOMIC":                int64(AccessRemoteAtomic),
		"IBV_QP_STATE":                            int64(AttrState),
		"IBV_QP_ACCESS_FLAGS":                     int64(AttrAccessFlags),
		"IBV_QP_PKEY_INDEX":                       int64(AttrPKeyIndex),
		"IBV_QP_PORT":                             int64(AttrPort),
		"IBV_QP_AV":                               int64(AttrAV),
		"IBV_QP_PATH_MTU":                         int64(AttrPathMTU),
		"IBV_QP_TIMEOUT":                          int64(AttrTimeout),
		"IBV_QP_RETRY_CNT":                        int64(AttrRetryCnt),
		"IBV_QP_RNR_RETRY":                        int64(AttrRNRRetry),
		"IBV_QP_RQ_PSN":                           int64(AttrRQPSN),
		"IBV_QP_MAX_QP_RD_ATOMIC":                 int64(AttrMaxQPRdAtomic),
		"IBV_QP_MIN_RNR_TIMER":                    int64(AttrMinRNRTimer),
		"IBV_QP_SQ_PSN":                           int64(AttrSQPSN),
		"IBV_QP_MAX_DEST_RD_ATOMIC":               int64(AttrMaxDestRdAtomc),
		"IBV_QP_DEST_QPN":                         int64(AttrDestQPN),
		"IBV_QPS_RESET":                           int64(QPReset),
		"IBV_QPS_INIT":                            int64(QPInit),
		"IBV_QPS_RTR":                             int64(QPRTR),
		"IBV_QPS_RTS":                             int64(QPRTS),
		"IBV_QPS_SQD":                             int64(QPSQD),
		"IBV_QPS_SQE":                             int64(QPSQE),
		"IBV_QPS_ERR":                             int64(QPErr),
		"IBV_WR_RDMA_WRITE":                       int64(OpWrite),
		"IBV_WR_RDMA_WRITE_WITH_IMM":              int64(OpWriteWithImm),
		"IBV_WR_SEND":                             int64(OpSend),
		"IBV_WR_SEND_WITH_IMM":                    int64(OpSendWithImm),
		"IBV_WR_RDMA_READ":                        int64(OpRead),
		"IBV_SEND_FENCE":                          int64(SendFence),
		"IBV_SEND_SIGNALED":                       int64(SendSignaled),
		"IBV_SEND_SOLICITED":                      int64(SendSolicited),
		"IBV_SEND_INLINE":                         int64(SendInline),
	}
	for k, v := range goFacts {
		r, ok := real[k]
		require.True(t, ok, "%s is not in ibv_layout.h", k)
		require.Equal(t, r, v, "Go's %s differs from verbs.h", k)
	}
	t.Logf("%d facts of ibv_abi.h and %d of the Go mirrors match verbs.h", len(mine), len(goFacts))
}

// The status names gccl prints are libibverbs' own.
func TestStatusNamesMatchLibrary(t *testing.T) {
	if _, err := libStatusString(0); errors.Is(err, ErrNotSupported) {
		t.Skipf("no libibverbs here: %v", err)
	}
	for s := range WCStatus(len(wcStatusNames) + 1) {
		lib, err := libStatusString(s)
		require.NoError(t, err)
		require.Equal(t, lib, s.String(), "status %d", s)
	}
}

// A missing library, or a library without the verbs, is ErrNotSupported
// naming the file (in a child process: the library is loaded once).
func TestLoadFailures(t *testing.T) {
	if path := os.Getenv("GCCL_VERBS_LOAD_HELPER"); path != "" {
		_, err := DeviceNames()
		fmt.Println(err)
		if errors.Is(err, ErrNotSupported) {
			os.Exit(0)
		}
		os.Exit(3)
	}
	for lib, want := range map[string]string{
		filepath.Join(t.TempDir(), "libnothing.so.1"): "cannot load " + "%s",
		"libc.so.6": "libc.so.6 has no ibv_get_device_list",
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLoadFailures$")
		cmd.Env = append(os.Environ(), "GCCL_VERBS_LOAD_HELPER=1", "GCCL_IBVERBS_LIBRARY="+lib, "GCCL_LEAKCHECK=0")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		if strings.Contains(want, "%s") {
			want = fmt.Sprintf(want, lib)
		}
		require.Contains(t, string(out), want)
	}
}
