package keeper

import (
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// BenchmarkStream is one request and its reply, as a task process and its
// keeper trade them for each event written, over a Unix socket pair.
func BenchmarkStream(b *testing.B) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		b.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	task, keeper := newStream(conns[0], maxMessage), newStream(conns[1], maxMessage)
	req := &request{
		Op:            opExec,
		SQL:           "INSERT INTO data_manager.event_store (context_id, run_id, seq, event_type, payload) SELECT $1, $2, s, t, p FROM unnest($3::int[], $4::text[], $5::jsonb[]) AS e(s, t, p)" + strings.Repeat(" ", 40),
		ParamOIDs:     []uint32{20, 20, 1007, 1009, 3807},
		Params:        [][]byte{[]byte("123456"), []byte("7"), []byte("{41}"), []byte(`{"ETL:PROGRESS"}`), []byte(`{"{\"done\": 4100, \"total\": 100000}"}`)},
		ParamFormats:  []int16{0, 0, 0, 0, 0},
		ResultFormats: []int16{0},
		Timeout:       30 * time.Second,
	}
	rep := &reply{
		Fields: []pgconn.FieldDescription{{Name: "seq", DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1}},
		Rows:   []values{{[]byte("41")}},
		Tag:    "INSERT 0 1",
	}
	done := make(chan error, 1)
	go func() {
		for {
			var r request
			if err := keeper.receive(&r); err != nil {
				done <- err
				return
			}
			if err := keeper.send(rep); err != nil {
				done <- err
				return
			}
		}
	}()
	b.ReportAllocs()
	for b.Loop() {
		if err := task.send(req); err != nil {
			b.Fatal(err)
		}
		if err := task.receive(new(reply)); err != nil {
			b.Fatal(err)
		}
	}
	conns[0].Close()
	<-done
}
