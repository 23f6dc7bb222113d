package kubernetes_test

import (
	"testing"

	"github.com/dama-etl/dama/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}
