package p2p

import "time"

// The local backend: both ends are this agent's (DRAM or VRAM). The
// initiator copies: host memory with the copy pool, a VRAM end with CUDA
// copies on the device's streams.
var localSpec = backendSpec{
	backend: localBackend{}, kind: BackendLocal, name: "local", inline: true,
	cost: costModel{fixed: 200 * time.Nanosecond, perPiece: 20 * time.Nanosecond, bytesPerSec: 7e9},
}

type localBackend struct{}

func (localBackend) serves(pl placement) (bool, string) {
	if !pl.self || pl.remoteType == FILE {
		return false, ""
	}
	why := "both ends in this process"
	if pl.vram() {
		why += "; CUDA copies"
	}
	return true, why
}

func (localBackend) prepare(r *Request) error {
	if r.hasVRAM() {
		return r.prepareCUDA()
	}
	return nil
}

func (localBackend) run(r *Request) error {
	if r.hasVRAM() {
		return r.runCUDA()
	}
	return r.runCopy()
}
