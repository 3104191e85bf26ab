package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/gccl/gccl/comm"
)

// rankInfo describes one rank of the job for the header's device list and
// the JSON report: where it runs and how it reaches each peer.
type rankInfo struct {
	Rank int    `json:"rank"`
	Pid  int    `json:"pid"`
	Host string `json:"host"`
	// Device is the rank's index among its host's ranks; under -M device,
	// the CUDA ordinal of the GPU its buffers are on, at PCI address BusID.
	Device int    `json:"device"`
	BusID  string `json:"bus_id,omitempty"`
	// Via names the transport to each peer, indexed by rank ("SHM", "TCP",
	// "INPROC"); "" for the rank itself.
	Via []string `json:"via"`
}

// describeRank returns c's rankInfo.
func describeRank(c *comm.Comm, pid int, host string, device int) rankInfo {
	info := rankInfo{Rank: c.Rank(), Pid: pid, Host: host, Device: device, Via: make([]string, c.Size())}
	for peer := range c.Size() {
		if peer != c.Rank() {
			info.Via[peer] = c.Via(peer)
		}
	}
	return info
}

// transports lists the distinct transports r uses, sorted. A rank without
// peers moves data only within its process: INPROC.
func (r rankInfo) transports() []string {
	var ts []string
	for _, v := range r.Via {
		if v != "" && !slices.Contains(ts, v) {
			ts = append(ts, v)
		}
	}
	if len(ts) == 0 {
		return []string{"INPROC"}
	}
	slices.Sort(ts)
	return ts
}

// jobTransports names the transports of the whole job, sorted and joined
// by "+": "SHM", "TCP", "SHM+TCP", "INPROC".
func jobTransports(devices []rankInfo) string {
	var ts []string
	for _, d := range devices {
		for _, t := range d.transports() {
			if !slices.Contains(ts, t) {
				ts = append(ts, t)
			}
		}
	}
	slices.Sort(ts)
	return strings.Join(ts, "+")
}

// transportLines describes which transport carries each pair of ranks, for
// the header: one line when every pair uses the same one, else one line per
// rank with runs of consecutive peers merged ("rank 0 -> 1 SHM, 2-3 TCP").
func transportLines(devices []rankInfo) []string {
	var uniform string
	mixed := false
	for _, d := range devices {
		for _, v := range d.Via {
			switch {
			case v == "":
			case uniform == "":
				uniform = v
			case v != uniform:
				mixed = true
			}
		}
	}
	if uniform == "" {
		return nil // a single rank: no pairs
	}
	if !mixed {
		return []string{"all pairs via " + uniform}
	}
	lines := make([]string, len(devices))
	for i, d := range devices {
		lines[i] = fmt.Sprintf("rank %d -> %s", d.Rank, peerRuns(d.Via))
	}
	return lines
}

// peerRuns renders a per-peer transport list as runs of consecutive peers
// using the same transport ("1 SHM, 2-3 TCP"), skipping the rank itself.
func peerRuns(via []string) string {
	var parts []string
	for p := 0; p < len(via); {
		if via[p] == "" {
			p++
			continue
		}
		end := p
		for end+1 < len(via) && via[end+1] == via[p] {
			end++
		}
		peers := fmt.Sprint(p)
		if end > p {
			peers = fmt.Sprintf("%d-%d", p, end)
		}
		parts = append(parts, peers+" "+via[p])
		p = end + 1
	}
	return strings.Join(parts, ", ")
}

// Rank descriptions travel through an AllGather of bytes, which needs one
// size on every rank: each record is a 4-byte length and the rankInfo's
// JSON, padded to the longest record of the job.
const recordLengthBytes = 4

// packRecord puts rec into a slot of slotSize bytes.
func packRecord(rec []byte, slotSize int) []byte {
	slot := make([]byte, slotSize)
	binary.LittleEndian.PutUint32(slot, uint32(len(rec)))
	copy(slot[recordLengthBytes:], rec)
	return slot
}

// unpackRankInfos reads the rankInfo of every rank from the gathered slots,
// checking that slot r describes rank r.
func unpackRankInfos(gathered []byte, slotSize int) ([]rankInfo, error) {
	if slotSize < recordLengthBytes || len(gathered)%slotSize != 0 {
		return nil, fmt.Errorf("%d gathered bytes do not split into records of %d", len(gathered), slotSize)
	}
	infos := make([]rankInfo, len(gathered)/slotSize)
	for r := range infos {
		slot := gathered[r*slotSize : (r+1)*slotSize]
		n := binary.LittleEndian.Uint32(slot)
		if int64(n) > int64(slotSize-recordLengthBytes) {
			return nil, fmt.Errorf("rank %d's record claims %d bytes, more than its slot of %d", r, n, slotSize-recordLengthBytes)
		}
		if err := json.Unmarshal(slot[recordLengthBytes:recordLengthBytes+int(n)], &infos[r]); err != nil {
			return nil, fmt.Errorf("rank %d's record: %w", r, err)
		}
		if infos[r].Rank != r {
			return nil, fmt.Errorf("record %d describes rank %d", r, infos[r].Rank)
		}
	}
	return infos, nil
}

// exchangeRankInfo gives every rank of c the description of every rank.
func exchangeRankInfo(ctx context.Context, c *comm.Comm, mine rankInfo) ([]rankInfo, error) {
	rec, err := json.Marshal(mine)
	if err != nil {
		return nil, err
	}
	longest := []int64{int64(len(rec))}
	if err := comm.AllReduce(ctx, c, longest, longest, comm.Max); err != nil {
		return nil, err
	}
	slotSize := recordLengthBytes + int(longest[0])
	gathered := make([]byte, slotSize*c.Size())
	if err := comm.AllGather(ctx, c, packRecord(rec, slotSize), gathered); err != nil {
		return nil, err
	}
	return unpackRankInfos(gathered, slotSize)
}
