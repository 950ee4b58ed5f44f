//go:build goexperiment.jsonv2

package kvsync

// The measurement behind keeping decode.go's tokenizer (kvsync/DESIGN.md,
// "What a read costs"): the same reads with the walk done by Go's
// encoding/json/jsontext, which needs GOEXPERIMENT=jsonv2 in Go 1.26. Run
// both in one go:
//
//	GOEXPERIMENT=jsonv2 go test -run '^$' -bench DecodeListing -benchmem ./kvsync

import (
	"bytes"
	"encoding/base64"
	"encoding/json/jsontext"
	"fmt"
	"testing"
)

func BenchmarkDecodeListingJSONText(b *testing.B) {
	dec := jsontext.NewDecoder(bytes.NewReader(nil)) // kept from read to read, as the window is
	var key []byte
	benchListings(b, false, func(body []byte, prefix string, value *[]byte) walkFunc {
		dec.Reset(bytes.NewReader(body))
		return func(f func(rel, v []byte) error) error { return walkJSONText(dec, prefix, value, &key, f) }
	})
}

// walkJSONText is walkListing with jsontext reading the tokens.
func walkJSONText(dec *jsontext.Decoder, prefix string, value, keyBuf *[]byte, f func(rel, v []byte) error) error {
	tok, err := dec.ReadToken()
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", errListing, err)
	case tok.Kind() == 'n':
		return nil
	case tok.Kind() != '[':
		return fmt.Errorf("%w: want an array of KV pairs", errListing)
	}
	for dec.PeekKind() == '{' {
		if _, err := dec.ReadToken(); err != nil {
			return fmt.Errorf("%w: %w", errListing, err)
		}
		var key, val []byte
		for dec.PeekKind() != '}' {
			name, err := dec.ReadValue()
			if err != nil {
				return fmt.Errorf("%w: %w", errListing, err)
			}
			switch {
			case bytes.EqualFold(name, []byte(`"Key"`)):
				v, err := dec.ReadValue()
				if err != nil {
					return fmt.Errorf("%w: %w", errListing, err)
				}
				if *keyBuf, err = jsontext.AppendUnquote((*keyBuf)[:0], v); err != nil {
					return fmt.Errorf("%w: %w", errListing, err)
				}
				key = *keyBuf
			case bytes.EqualFold(name, []byte(`"Value"`)):
				v, err := dec.ReadValue()
				if err != nil {
					return fmt.Errorf("%w: %w", errListing, err)
				}
				if v.Kind() == 'n' {
					val = nil
					break
				}
				raw := v[1 : len(v)-1]
				n := base64.StdEncoding.DecodedLen(len(raw))
				if cap(*value) < n {
					*value = make([]byte, n)
				}
				if n, err = base64.StdEncoding.Decode((*value)[:n], raw); err != nil {
					return fmt.Errorf("%w: value of %q: %w", errListing, key, err)
				}
				val = (*value)[:n]
			default:
				if err := dec.SkipValue(); err != nil {
					return fmt.Errorf("%w: %w", errListing, err)
				}
			}
		}
		if _, err := dec.ReadToken(); err != nil {
			return fmt.Errorf("%w: %w", errListing, err)
		}
		if rel, ok := bytes.CutPrefix(key, []byte(prefix)); ok && len(rel) > 0 && (len(val) > 0 || rel[len(rel)-1] != '/') {
			if err := f(rel, val); err != nil {
				return err
			}
		}
	}
	if _, err := dec.ReadToken(); err != nil {
		return fmt.Errorf("%w: %w", errListing, err)
	}
	return nil
}
