package keeper

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"reflect"
	"testing"
)

// FuzzSession reads arbitrary bytes as a session's requests, as the keeper
// does from anyone who may connect: it stops at the first it cannot read,
// and never takes a frame beyond its limit. Arbitrary values pack and
// unpack to themselves.
func FuzzSession(f *testing.F) {
	frame := func(v any) []byte {
		var body bytes.Buffer
		if err := gob.NewEncoder(&body).Encode(v); err != nil {
			f.Fatal(err)
		}
		return binary.BigEndian.AppendUint32(nil, uint32(body.Len()))
	}
	hello := func() []byte {
		var body bytes.Buffer
		gob.NewEncoder(&body).Encode(&request{Op: opHello, Version: Version, ContextID: 42, RunKey: "k"})
		return append(frame(&request{Op: opHello, Version: Version, ContextID: 42, RunKey: "k"}), body.Bytes()...)
	}
	f.Add(hello(), []byte{0, 0, 0, 1, 0xff, 0, 0, 0, 0, 'a'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, []byte{})
	f.Add([]byte{0, 0, 0, 0}, []byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8}, []byte{0, 0, 0, 3, 'a'})
	f.Fuzz(func(t *testing.T, in, packed []byte) {
		fr := &frameReader{r: bufio.NewReader(bytes.NewReader(in))}
		fr.limit.Store(maxHello)
		dec := gob.NewDecoder(fr)
		for range 16 {
			var req request
			if err := dec.Decode(&req); err != nil {
				break
			}
		}
		for n := range 4 {
			values, err := unpackValues(packed, n)
			if err != nil {
				continue
			}
			if again, err := unpackValues(packValues(values), n); err != nil || !reflect.DeepEqual(again, values) {
				t.Fatalf("%q unpacks to %q, which packs and unpacks to %q, %v", packed, values, again, err)
			}
		}
	})
}
