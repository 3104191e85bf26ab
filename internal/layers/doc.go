// Package layers holds the test that checks gccl's import rules
// (docs/ARCHITECTURE.md): nothing below the public API imports it.
package layers
