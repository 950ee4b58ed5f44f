package state

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
)

// Digest is a SHA-256 over KV content (keys relative to the prefix), as
// sorted lines of quoted key=value. Replicas holding the same mirrored KV
// have the same digest, and `hastate wait` compares it with Consul's.
func Digest(kv map[string]string) string {
	return digest(kv)
}

// Digest is the digest of the mirrored KV content, without copying it.
func (m *Mirror) Digest() string { return digest(m.raw) }

func digest(kv map[string]string) string {
	h := sha256.New()
	var line []byte
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		line = strconv.AppendQuote(line[:0], k)
		line = append(line, '=')
		line = strconv.AppendQuote(line, kv[k])
		line = append(line, '\n')
		h.Write(line)
	}
	return hex.EncodeToString(h.Sum(nil))
}
