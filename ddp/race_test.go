//go:build race

package ddp_test

const raceEnabled = true
