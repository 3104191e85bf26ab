package comm

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// inheritedCPUs returns the CPUs this process may run on.
func inheritedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var cpus []int
	for c := 0; c < len(set)*64 && len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// pinThread locks the calling goroutine to its OS thread and restricts the
// thread to cpus. The goroutine must not unlock it: when it exits, Go then
// ends the thread instead of reusing it with the narrowed mask.
func pinThread(cpus []int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return unix.SchedSetaffinity(0, &set)
}
