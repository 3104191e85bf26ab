package p2p

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/verbs"
)

// An agent's RDMA device: opened at New unless RDMA is off
// (Config.DisableRDMA, GCCL_P2P_RDMA_DISABLE=1, GCCL_IB_DISABLE=1) or
// there is none; its port is published in the metadata, and every DRAM
// and VRAM region is registered with it (regcache.go), its keys published
// with the region.

// rdmaInfo is what an agent publishes of its RDMA port (metadata version 3).
type rdmaInfo struct {
	Device    string
	Port      uint8
	LinkLayer verbs.LinkLayer
	MTU       verbs.MTU
	LID       uint16
	GID       verbs.GID
}

func (i *rdmaInfo) String() string {
	return fmt.Sprintf("%s:%d %v gid %v lid %#x", i.Device, i.Port, i.LinkLayer, i.GID, i.LID)
}

// sameFabric says whether two ports can reach each other, as far as their
// published addresses tell: the same link layer, and on InfiniBand the
// same subnet (RoCE v2 is routed over IP: any two ports are taken to
// reach each other).
func sameFabric(a, b *rdmaInfo) (bool, string) {
	switch {
	case a == nil || b == nil:
		return false, "no RDMA device"
	case a.LinkLayer != b.LinkLayer:
		return false, fmt.Sprintf("different link layers (%v here, %v there)", a.LinkLayer, b.LinkLayer)
	case a.LinkLayer == verbs.LinkInfiniBand && a.GID.SubnetPrefix() != b.GID.SubnetPrefix():
		return false, fmt.Sprintf("different InfiniBand subnets (%#x here, %#x there)", a.GID.SubnetPrefix(), b.GID.SubnetPrefix())
	case a.LinkLayer == verbs.LinkEthernet && a.GID.IPv4Mapped() != b.GID.IPv4Mapped():
		return false, "RoCE GIDs of different families (IPv4 and IPv6)"
	}
	return true, ""
}

// rdmaDevice is an agent's open RDMA device and its registrations.
type rdmaDevice struct {
	log   *slog.Logger
	ctx   *verbs.Context
	pd    *verbs.PD
	port  verbs.Port
	vcfg  verbs.Config
	info  rdmaInfo
	cache *regCache
	gpu   *gpuState
}

// rdmaPick is the device port chosen for this process (Select reads sysfs,
// which takes seconds under emulation: once per process and environment).
type devicePick struct {
	env  string
	dev  string
	cand verbs.Candidate
	sel  bool // cand came from Select
	err  error
	done bool
}

var rdmaPick struct {
	sync.Mutex
	devicePick
}

func ibEnv() string {
	var b strings.Builder
	for _, k := range []string{"GCCL_IB_DISABLE", "GCCL_IB_HCA", "GCCL_IB_GID_INDEX", "GCCL_IBVERBS_LIBRARY"} {
		b.WriteString(k + "=" + os.Getenv(k) + ";")
	}
	return b.String()
}

// openRDMA opens the device port this process uses, or says why there is
// none (an error wrapping ErrNotSupported).
func openRDMA(cfg Config, log *slog.Logger, gpu *gpuState) (*rdmaDevice, error) {
	vcfg, err := verbs.ConfigFromEnv()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotSupported, err)
	}
	if vcfg.Disable {
		return nil, fmt.Errorf("%w: RDMA is disabled (GCCL_IB_DISABLE=1)", ErrNotSupported)
	}
	rdmaPick.Lock()
	if env := ibEnv(); !rdmaPick.done || rdmaPick.env != env {
		rdmaPick.env, rdmaPick.done = env, true
		rdmaPick.cand, rdmaPick.err = verbs.Select(vcfg, verbs.Near{NUMA: -1}, log)
		rdmaPick.sel = rdmaPick.err == nil
		if !rdmaPick.sel {
			// No device in sysfs: a library whose devices sysfs does not
			// list (the tests' fake) may still have one.
			if names, err := verbs.DeviceNames(); err == nil {
				for _, n := range names {
					if vcfg.HCA.Match(n, 1) {
						rdmaPick.dev, rdmaPick.err = n, nil
						break
					}
				}
			}
		}
	}
	pick := rdmaPick.devicePick
	rdmaPick.Unlock()
	if pick.err != nil {
		return nil, pick.err
	}
	d := &rdmaDevice{log: log, vcfg: vcfg, gpu: gpu}
	name := pick.dev
	if pick.sel {
		name = pick.cand.Device
	}
	if d.ctx, err = verbs.Open(name); err != nil {
		return nil, err
	}
	if pick.sel {
		d.port, err = d.ctx.CandidatePort(pick.cand)
	} else {
		d.port, err = d.ctx.Port(1, vcfg)
	}
	if err == nil {
		d.pd, err = d.ctx.AllocPD()
	}
	if err != nil {
		d.ctx.Close()
		return nil, err
	}
	d.info = rdmaInfo{Device: name, Port: uint8(d.port.Num), LinkLayer: d.port.Attr.LinkLayer, MTU: d.port.Attr.ActiveMTU,
		LID: d.port.Attr.LID, GID: d.port.GID.GID}
	d.cache = newRegCache(log, uint64(cfg.RDMAMaxMRSize), uint64(cfg.RDMARegCacheBytes), d.register)
	return d, nil
}

// register makes one MR: host memory with ibv_reg_mr; device memory as a
// dma-buf (ibv_reg_dmabuf_mr of cuMemGetHandleForAddressRange's fd), else
// with ibv_reg_mr on the device address (nvidia-peermem).
func (d *rdmaDevice) register(key regKey, addr, n uint64) (mrHandle, string, error) {
	if key.typ != VRAM {
		mr, err := d.pd.RegisterAddr(uintptr(addr), int(n), verbs.AccessAll)
		return mr, "host memory", err
	}
	mr, dmaErr := d.registerDmabuf(key.dev, addr, n)
	if dmaErr == nil {
		return mr, "dma-buf", nil
	}
	mr2, err := d.pd.RegisterAddr(uintptr(addr), int(n), verbs.AccessAll)
	if err == nil {
		return mr2, "peer memory", nil
	}
	return nil, "", fmt.Errorf("dma-buf: %v; peer memory (nvidia-peermem): %v", dmaErr, err)
}

// registerDmabuf registers n bytes of device memory at addr through the
// dma-buf of the allocation holding it.
func (d *rdmaDevice) registerDmabuf(dev int, addr, n uint64) (mrHandle, error) {
	ctx, err := d.gpu.context(dev)
	if err != nil {
		return nil, err
	}
	if ok, err := d.gpu.dmabufSupported(dev); err != nil || !ok {
		return nil, fmt.Errorf("device %d does not export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: %v)", dev, err)
	}
	info, err := ctx.PointerInfo(cuda.DevicePtr(addr))
	if err != nil {
		return nil, err
	}
	const page = 4096
	base := uint64(info.Base) &^ (page - 1)
	size := (uint64(info.Base) + uint64(info.Size) - base + page - 1) &^ (page - 1)
	fd, err := ctx.DmaBufFD(cuda.DevicePtr(base), int(size))
	if err != nil {
		return nil, err
	}
	defer os.NewFile(uintptr(fd), "dma-buf").Close() // portable: a Handle on Windows
	return d.pd.RegisterDmabuf(addr-base, int(n), addr, fd, verbs.AccessAll)
}

func (d *rdmaDevice) close() error {
	d.cache.close()
	return errors.Join(d.pd.Close(), d.ctx.Close())
}

// rdmaRegister registers a new region's memory, or says why not (logged
// once per kind: the region's transfers then go another way).
func (a *Agent) rdmaRegister(key regKey) *regEntry {
	d := a.rdma
	if d == nil {
		return nil
	}
	e, err := d.cache.acquire(key)
	if err != nil {
		what := "DRAM"
		if key.typ == VRAM {
			what = "VRAM (no GPUDirect RDMA)"
		}
		if _, seen := a.logged.LoadOrStore("rdma-reg/"+what, true); !seen {
			msg := "p2p cannot register " + what + " with the RDMA device; transfers of such regions between hosts go over tcp"
			if key.typ == VRAM {
				msg += ", staged through pinned bounce buffers"
			}
			a.log.Warn(msg, "device", d.info.Device, "bytes", key.len, "err", err)
		}
		return nil
	}
	if key.typ == VRAM {
		a.log.Debug("p2p registered VRAM for RDMA", "device", key.dev, "bytes", key.len, "how", e.how)
	}
	return e
}

// RDMADevice names the RDMA device and port the agent uses ("" when it
// uses none) and says why not.
func (a *Agent) RDMADevice() (string, error) {
	if a.rdma == nil {
		return "", a.rdmaErr
	}
	return a.rdma.info.String(), nil
}
