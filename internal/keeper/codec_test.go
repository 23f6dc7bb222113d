package keeper

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// sampleMessages are messages with every field set, at the edges of their
// ranges where there are edges, and values both NULL and empty.
func sampleMessages() []any {
	return []any{
		&request{Op: opHello, Version: Version, ContextID: math.MaxInt64, RunKey: "9f86d081884c7d65"},
		&request{
			Op: opExec, SQL: "SELECT $1::bigint, $2::text", ParamOIDs: []uint32{20, math.MaxUint32},
			Params: [][]byte{[]byte("42"), nil, {}}, ParamFormats: []int16{0, 1, math.MinInt16},
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
			Rows: []values{{[]byte("1"), nil}, {{}, []byte("x")}},
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

func encoded(m any) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func decodedLike(m any, b []byte) (any, error) {
	out := reflect.New(reflect.TypeOf(m).Elem()).Interface()
	return out, json.Unmarshal(b, out)
}

// reflect.DeepEqual tells a nil value (NULL) from an empty one: JSON keeps
// them apart, as null and "".
func TestMessagesDecodeToWhatWasEncoded(t *testing.T) {
	for _, m := range sampleMessages() {
		b := encoded(m)
		got, err := decodedLike(m, b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("%+v encodes to %s, which decodes to %+v, %v", m, b, got, err)
		}
		// A message cut short, or with a byte more, is refused.
		for _, bad := range [][]byte{b[:len(b)-1], append(b[:len(b):len(b)], 0)} {
			if got, err := decodedLike(m, bad); err == nil {
				t.Errorf("%s decoded as %T to %+v", bad, m, got)
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
		for _, like := range []any{&request{}, &reply{}} {
			m, err := decodedLike(like, b)
			if err != nil {
				continue
			}
			again, err := decodedLike(like, encoded(m))
			if err != nil || !reflect.DeepEqual(again, m) {
				t.Fatalf("%q decodes as %T to %+v, which encodes and decodes to %+v, %v", b, like, m, again, err)
			}
		}
	})
}

// A message that claims more elements than it holds, an array cut short,
// is refused before anything is allocated for them: json.Unmarshal checks
// the whole message before it decodes any of it.
func TestAMessageClaimingMoreThanItHoldsAllocatesNothingForIt(t *testing.T) {
	const size = 1 << 20
	claim := func(prefix, element string) []byte {
		return append([]byte(prefix), strings.Repeat(element, size/len(element))...)
	}
	for _, c := range []struct {
		name string
		like any
		msg  []byte
	}{
		{"param OIDs", &reply{}, claim(`{"ParamOIDs":[`, "1,")},
		{"fields", &reply{}, claim(`{"Fields":[`, "{},")},
		{"rows", &reply{}, claim(`{"Rows":[`, "[],")},
		{"request OIDs", &request{}, claim(`{"Op":3,"ParamOIDs":[`, "1,")},
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

// A request the keeper decodes makes it allocate a few times its size at
// the most, however dense its arrays: the values travel packed (values),
// where an array of "" made it allocate 47 times the frame's size.
func TestARequestAllocatesAFewTimesItsSize(t *testing.T) {
	const size = 1 << 20
	nulls := encoded(values(make([][]byte, size/4)))
	for _, c := range []struct {
		name string
		msg  []byte
	}{
		{"values", fmt.Appendf(nil, `{"Op":3,"Params":%s}`, nulls)},
		{"OIDs", fmt.Appendf(nil, `{"Op":3,"ParamOIDs":[%s0]}`, strings.Repeat("0,", size/2))},
		{"formats", fmt.Appendf(nil, `{"Op":3,"ParamFormats":[%s0]}`, strings.Repeat("0,", size/2))},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := decodedLike(&request{}, c.msg)
		runtime.ReadMemStats(&after)
		got := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %d bytes allocated for a request of %d bytes", c.name, got, len(c.msg))
		if err != nil || got > 16*uint64(len(c.msg)) {
			t.Errorf("%s: a request of %d bytes allocated %d bytes, %v", c.name, len(c.msg), got, err)
		}
	}
}
