//go:build race

package test

// raceEnabled: the tests run with -race, so hastate is built with it too.
const raceEnabled = true
