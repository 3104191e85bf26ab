package verbs

import (
	"path/filepath"

	"github.com/Mellanox/rdmamap"
)

// deviceNames lists the RDMA devices: through rdmamap on the real system,
// from the fake tree in tests (rdmamap reads the fixed path
// /sys/class/infiniband).
func deviceNames(root string) []string {
	if filepath.Clean(root) == "/" {
		return rdmamap.GetRdmaDeviceList()
	}
	return dirNames(filepath.Join(root, "sys/class/infiniband"))
}
