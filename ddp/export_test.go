package ddp

// started is the number of buckets this step has handed to the Reducer's
// goroutine.
func (r *Reducer) started() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.next
}

// finished is the number of this step's reductions that have returned and
// that Wait has not yet collected.
func (r *Reducer) finished() int { return len(r.done) }

// inSymmetricMemory reports whether the buffer that is all-reduced lies in
// memory from Comm.Alloc.
func (r *Reducer) inSymmetricMemory() bool { return len(r.syms) > 0 }

// Started, Finished and InSymmetricMemory export them to the external tests.
var (
	Started           = (*Reducer).started
	Finished          = (*Reducer).finished
	InSymmetricMemory = (*Reducer).inSymmetricMemory
)
