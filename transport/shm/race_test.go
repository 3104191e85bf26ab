//go:build race

package shm

// raceEnabled: the race detector's own memory takes page faults.
const raceEnabled = true
