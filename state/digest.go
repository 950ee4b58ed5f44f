package state

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
)

// Digest is a SHA-256 over KV content (keys relative to the prefix), as
// sorted lines of quoted key=value. Replicas holding the same mirrored KV
// have the same digest, and `hastate wait` compares it with Consul's.
func Digest(kv map[string]string) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		fmt.Fprintf(h, "%q=%q\n", k, kv[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}
