package keeper

import (
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The keeper's messages are written by hand rather than with encoding/gob:
// a gob stream sends its types with its first value and compiles a decoder
// per stream, and each message is a stream of its own (a frame decoded
// alone), so every message paid for both. A task process sends one each
// second at the least; the keeper serves a thousand.
//
// A message is its fields in the order of its struct, each written as:
// an integer as a varint (unsigned ones as uvarints), a string or bytes as
// their length as a uvarint then the bytes, a slice as its length then its
// elements, a pointer as a byte (0 nil, 1 set) then what it points to.
// Decoding checks every length against what is left of the message, every
// integer against its type's range, and that nothing is left over.

// errMalformed is what decoding fails with on a message its encoder could
// not have written.
var errMalformed = errors.New("a malformed message")

type encoder struct{ b []byte }

func (e *encoder) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) int(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) str(s string)  { e.uint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *encoder) bytes(b []byte) {
	e.uint(uint64(len(b)))
	e.b = append(e.b, b...)
}
func (e *encoder) present(set bool) {
	if set {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() { d.err, d.b = errMalformed, nil }

func (d *decoder) uint(hi uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > hi {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) int(lo, hi int64) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 || v < lo || v > hi {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) u32() uint32 { return uint32(d.uint(math.MaxUint32)) }
func (d *decoder) i16() int16  { return int16(d.int(math.MinInt16, math.MaxInt16)) }
func (d *decoder) i32() int32  { return int32(d.int(math.MinInt32, math.MaxInt32)) }

// count reads the length of a slice whose elements take at least size
// bytes each: no length is believed beyond what is left of the message,
// so that what is allocated for it stays within a few times its size.
func (d *decoder) count(size int) int {
	n := d.uint(math.MaxInt32)
	if n > uint64(len(d.b)/size) {
		d.fail()
		return 0
	}
	return int(n)
}

func (d *decoder) bytes() []byte {
	n := d.count(1)
	if d.err != nil || n == 0 {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str() string { return string(d.bytes()) }

func (d *decoder) present() bool {
	if d.err != nil || len(d.b) == 0 || d.b[0] > 1 {
		d.fail()
		return false
	}
	set := d.b[0] == 1
	d.b = d.b[1:]
	return set
}

// end is the decoding's error: a message must be read to its last byte.
func (d *decoder) end() error {
	if d.err == nil && len(d.b) > 0 {
		d.fail()
	}
	return d.err
}

func (e *encoder) oids(v []uint32) {
	e.uint(uint64(len(v)))
	for _, x := range v {
		e.uint(uint64(x))
	}
}

func (d *decoder) oids() []uint32 {
	n := d.count(1)
	if n == 0 {
		return nil
	}
	v := make([]uint32, n)
	for i := range v {
		v[i] = d.u32()
	}
	return v
}

func (e *encoder) formats(v []int16) {
	e.uint(uint64(len(v)))
	for _, x := range v {
		e.int(int64(x))
	}
}

func (d *decoder) formats() []int16 {
	n := d.count(1)
	if n == 0 {
		return nil
	}
	v := make([]int16, n)
	for i := range v {
		v[i] = d.i16()
	}
	return v
}

// message is what a stream carries.
type message interface {
	encode(e *encoder)
	decode(d *decoder)
}

func (r *request) encode(e *encoder) {
	e.uint(uint64(r.Op))
	e.int(int64(r.Version))
	e.int(r.ContextID)
	e.str(r.RunKey)
	e.str(r.SQL)
	e.oids(r.ParamOIDs)
	e.bytes(r.Params)
	e.formats(r.ParamFormats)
	e.formats(r.ResultFormats)
	e.int(int64(r.Timeout))
	e.int(int64(r.Depth))
	e.str(r.Channel)
}

func (r *request) decode(d *decoder) {
	r.Op = op(d.uint(math.MaxUint8))
	r.Version = int(d.int(math.MinInt32, math.MaxInt32))
	r.ContextID = d.int(math.MinInt64, math.MaxInt64)
	r.RunKey = d.str()
	r.SQL = d.str()
	r.ParamOIDs = d.oids()
	r.Params = d.bytes()
	r.ParamFormats = d.formats()
	r.ResultFormats = d.formats()
	r.Timeout = time.Duration(d.int(math.MinInt64, math.MaxInt64))
	r.Depth = int(d.int(math.MinInt32, math.MaxInt32))
	r.Channel = d.str()
}

func (r *reply) encode(e *encoder) {
	e.present(r.Err != nil)
	if r.Err != nil {
		r.Err.encode(e)
	}
	e.oids(r.ParamOIDs)
	e.uint(uint64(len(r.Fields)))
	for _, f := range r.Fields {
		e.str(f.Name)
		e.uint(uint64(f.TableOID))
		e.uint(uint64(f.TableAttributeNumber))
		e.uint(uint64(f.DataTypeOID))
		e.int(int64(f.DataTypeSize))
		e.int(int64(f.TypeModifier))
		e.int(int64(f.Format))
	}
	e.uint(uint64(len(r.Rows)))
	for _, row := range r.Rows {
		e.bytes(row)
	}
	e.str(r.Tag)
	e.present(r.Notification != nil)
	if n := r.Notification; n != nil {
		e.uint(uint64(n.PID))
		e.str(n.Channel)
		e.str(n.Payload)
	}
}

func (r *reply) decode(d *decoder) {
	if d.present() {
		r.Err = new(wireError)
		r.Err.decode(d)
	}
	r.ParamOIDs = d.oids()
	// A field takes 7 bytes at the least: its name's length and six
	// integers.
	if n := d.count(7); n > 0 {
		r.Fields = make([]pgconn.FieldDescription, n)
		for i := range r.Fields {
			f := &r.Fields[i]
			f.Name = d.str()
			f.TableOID = d.u32()
			f.TableAttributeNumber = uint16(d.uint(math.MaxUint16))
			f.DataTypeOID = d.u32()
			f.DataTypeSize = d.i16()
			f.TypeModifier = d.i32()
			f.Format = d.i16()
		}
	}
	if n := d.count(1); n > 0 {
		r.Rows = make([][]byte, n)
		for i := range r.Rows {
			r.Rows[i] = d.bytes()
		}
	}
	r.Tag = d.str()
	if d.present() {
		r.Notification = &pgconn.Notification{PID: d.u32(), Channel: d.str(), Payload: d.str()}
	}
}

func (w *wireError) encode(e *encoder) {
	e.uint(uint64(w.Kind))
	e.str(w.Message)
	e.present(w.PgError != nil)
	if p := w.PgError; p != nil {
		e.str(p.Severity)
		e.str(p.SeverityUnlocalized)
		e.str(p.Code)
		e.str(p.Message)
		e.str(p.Detail)
		e.str(p.Hint)
		e.int(int64(p.Position))
		e.int(int64(p.InternalPosition))
		e.str(p.InternalQuery)
		e.str(p.Where)
		e.str(p.SchemaName)
		e.str(p.TableName)
		e.str(p.ColumnName)
		e.str(p.DataTypeName)
		e.str(p.ConstraintName)
		e.str(p.File)
		e.int(int64(p.Line))
		e.str(p.Routine)
	}
}

func (w *wireError) decode(d *decoder) {
	w.Kind = errKind(d.uint(math.MaxUint8))
	w.Message = d.str()
	if d.present() {
		w.PgError = &pgconn.PgError{
			Severity:            d.str(),
			SeverityUnlocalized: d.str(),
			Code:                d.str(),
			Message:             d.str(),
			Detail:              d.str(),
			Hint:                d.str(),
			Position:            d.i32(),
			InternalPosition:    d.i32(),
			InternalQuery:       d.str(),
			Where:               d.str(),
			SchemaName:          d.str(),
			TableName:           d.str(),
			ColumnName:          d.str(),
			DataTypeName:        d.str(),
			ConstraintName:      d.str(),
			File:                d.str(),
			Line:                d.i32(),
			Routine:             d.str(),
		}
	}
}
