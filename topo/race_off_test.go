//go:build !race

package topo

// raceEnabled says the race detector slows these tests (timing checks skip).
const raceEnabled = false
