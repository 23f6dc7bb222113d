package keeper

import (
	"math"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// sampleMessages are messages with every field set, at the edges of their
// ranges where there are edges.
func sampleMessages() []message {
	return []message{
		&request{Op: opHello, Version: Version, ContextID: math.MaxInt64, RunKey: "9f86d081884c7d65"},
		&request{
			Op: opExec, SQL: "SELECT $1::bigint, $2::text", ParamOIDs: []uint32{20, math.MaxUint32},
			Params: packValues([][]byte{[]byte("42"), nil, {}}), ParamFormats: []int16{0, 1, math.MinInt16},
			ResultFormats: []int16{math.MaxInt16}, Timeout: -time.Second, Depth: math.MaxInt32, Channel: "dama_cancel",
		},
		&request{Op: opPing, ContextID: math.MinInt64, Timeout: math.MaxInt64, Depth: math.MinInt32},
		&reply{},
		&reply{
			ParamOIDs: []uint32{0, 25},
			Fields: []pgconn.FieldDescription{
				{Name: "id", TableOID: math.MaxUint32, TableAttributeNumber: math.MaxUint16, DataTypeOID: 20, DataTypeSize: 8, TypeModifier: -1, Format: 1},
				{Name: "ünïcode\x00", DataTypeSize: math.MinInt16, TypeModifier: math.MaxInt32, Format: math.MinInt16},
			},
			Rows: [][]byte{packValues([][]byte{[]byte("1"), nil}), packValues([][]byte{{}, []byte("x")})},
			Tag:  "SELECT 2",
		},
		&reply{Err: &wireError{Kind: errLocked, Message: "held"}},
		&reply{Err: &wireError{Kind: errStatement, Message: "refused", PgError: &pgconn.PgError{
			Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "23505", Message: "duplicate key", Detail: "d", Hint: "h",
			Position: math.MaxInt32, InternalPosition: math.MinInt32, InternalQuery: "q", Where: "w", SchemaName: "data_manager",
			TableName: "etl_contexts", ColumnName: "c", DataTypeName: "t", ConstraintName: "k", File: "nbtinsert.c", Line: 666, Routine: "_bt_check_unique",
		}}},
		&reply{Notification: &pgconn.Notification{PID: math.MaxUint32, Channel: "dama_task_finished", Payload: `{"id":1}`}},
	}
}

func encoded(m message) []byte {
	var e encoder
	m.encode(&e)
	return e.b
}

func decodedLike(m message, b []byte) (message, error) {
	out := reflect.New(reflect.TypeOf(m).Elem()).Interface().(message)
	d := decoder{b: b}
	out.decode(&d)
	return out, d.end()
}

func TestMessagesDecodeToWhatWasEncoded(t *testing.T) {
	for _, m := range sampleMessages() {
		b := encoded(m)
		got, err := decodedLike(m, b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("%+v encodes to %x, which decodes to %+v, %v", m, b, got, err)
		}
		// A message cut short, or with a byte more, is refused.
		for _, bad := range [][]byte{b[:len(b)-1], append(b[:len(b):len(b)], 0)} {
			if got, err := decodedLike(m, bad); err == nil {
				t.Errorf("%x decoded as %T to %+v", bad, m, got)
			}
		}
	}
}

// Both sides of the stream carry messages as they were sent.
func TestAStreamCarriesMessages(t *testing.T) {
	client, server := pipePair(t)
	defer client.conn.Close()
	defer server.conn.Close()
	go func() {
		for _, m := range sampleMessages() {
			if _, ok := m.(*request); ok {
				client.send(m)
			}
		}
	}()
	for _, m := range sampleMessages() {
		if _, ok := m.(*request); !ok {
			continue
		}
		var got request
		if err := server.receive(&got); err != nil || !reflect.DeepEqual(&got, m) {
			t.Fatalf("sent %+v, received %+v, %v", m, &got, err)
		}
	}
}

// FuzzDecodeMessage decodes arbitrary bytes as each message: nothing
// panics, and what decodes encodes to bytes that decode to the same
// message. (What a count may make decoding allocate is
// TestAMessageClaimingMoreThanItHoldsAllocatesNothingForIt's.)
func FuzzDecodeMessage(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(encoded(m))
	}
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, like := range []message{&request{}, &reply{}} {
			m, err := decodedLike(like, b)
			if err != nil {
				continue
			}
			again, err := decodedLike(like, encoded(m))
			if err != nil || !reflect.DeepEqual(again, m) {
				t.Fatalf("%x decodes as %T to %+v, which encodes and decodes to %+v, %v", b, like, m, again, err)
			}
		}
	})
}

// A message that claims more elements than it can hold is refused before
// anything is allocated for them: a field takes 7 bytes at the least, an
// OID or a row 1.
func TestAMessageClaimingMoreThanItHoldsAllocatesNothingForIt(t *testing.T) {
	const size = 1 << 20
	filler := make([]byte, size)
	for i := range filler {
		filler[i] = 1 // a valid one-byte varint, so decoding goes on
	}
	claim := func(prefix []byte, count uint64) []byte {
		var e encoder
		e.b = append(e.b, prefix...)
		e.uint(count)
		return append(e.b, filler...)
	}
	for _, c := range []struct {
		name string
		like message
		msg  []byte
	}{
		// A reply: no error, then the parameters' OIDs, then the fields,
		// then the rows.
		{"param OIDs", &reply{}, claim([]byte{0}, size+1)},
		{"fields", &reply{}, claim([]byte{0, 0}, size/2)},
		{"rows", &reply{}, claim([]byte{0, 0, 0}, size+1)},
		// A request: op, version, context, run key, SQL, then the OIDs.
		{"request OIDs", &request{}, claim([]byte{byte(opExec), 2, 2, 0, 0}, size+1)},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := decodedLike(c.like, c.msg)
		runtime.ReadMemStats(&after)
		if got := after.TotalAlloc - before.TotalAlloc; err == nil || got > size/4 {
			t.Errorf("%s: a message of %d bytes claiming more than it holds allocated %d bytes, %v", c.name, len(c.msg), got, err)
		}
	}
}
