//go:build race

package store_test

// raceEnabled: the race detector allows at most 8128 live goroutines.
const raceEnabled = true
