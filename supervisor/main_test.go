package supervisor_test

import (
	"context"
	"os"
	"testing"

	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/supervisor"
)

func TestMain(m *testing.M) {
	// The function kinds' examples run their tasks in this test binary,
	// started again by their supervisor.
	if code, ok := supervisor.RunTaskProcess(context.Background(), exampleFuncs()); ok {
		os.Exit(code)
	}
	testenv.Main(m)
}
