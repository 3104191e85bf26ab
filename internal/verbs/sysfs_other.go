//go:build !linux

package verbs

import "path/filepath"

// deviceNames lists the RDMA devices of a sysfs tree; only Linux has one,
// so on the real root of another system there are none.
func deviceNames(root string) []string {
	if filepath.Clean(root) == "/" {
		return nil
	}
	return dirNames(filepath.Join(root, "sys/class/infiniband"))
}
