package clock

import "os"

const counterName = "tsc"

// counterUsable: the TSC ticks at a constant rate in every power state
// (CPUID's invariant TSC) and Linux keeps time with it, which it does only
// once it has found the cores' counters in step.
var counterUsable = invariantTSC() && kernelClock() == "tsc"

func kernelClock() string {
	b, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	if err != nil {
		return ""
	}
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return string(b)
}

// ticks reads the TSC.
func ticks() uint64

// invariantTSC reports CPUID.80000007H:EDX[8].
func invariantTSC() bool
