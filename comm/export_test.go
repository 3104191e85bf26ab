package comm

// Hooks for the external tests.

// SymMinBytes is the smallest all-reduce that takes the symmetric path.
const SymMinBytes = symMinBytes

// SymNTMinBytes is the smallest all-reduce written with non-temporal stores.
const SymNTMinBytes = symNTMinBytes

// SymOps counts the symmetric-memory all-reduces c has run.
func SymOps(c *Comm) uint64 { return c.symOps.Load() }
