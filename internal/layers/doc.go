// Package layers holds no code: its test reads the imports of every
// package of the module and fails on one that the dependency direction of
// docs/architecture.md does not allow, so that the layering is checked by
// `make test`, not only drawn.
package layers
