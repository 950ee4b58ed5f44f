package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// A full data disk: the write that does not fit fails with an error that
// says so, the replica keeps serving the last applied state, and it
// recovers once space is freed. The disk is a 1 MiB tmpfs, which needs root
// (CI runs as root).
func TestFullDiskKeepsServingAndRecovers(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mounting a 1 MiB tmpfs for the full-disk test needs root (CI runs as root): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 600<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	n := startNode(t, Options{ID: "n1", BindAddr: addr, Advertise: addr, DataDir: data})
	testenv.Eventually(t, 5*time.Second, func() error { return testenv.Expect(n.IsLeader(), "no leader") })
	ctx := context.Background()
	kv := map[string]string{"state/web/a": "drain"}
	if err := n.ApplyKV(ctx, 1, kv); err != nil {
		t.Fatal(err)
	}

	big := strings.Repeat("x", 20000)
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		kv[fmt.Sprintf("state/web/s%d", i)] = `{"state":"maint","reason":"` + big + `"}`
		err = n.ApplyKV(ctx, uint64(i+2), kv)
	}
	if err == nil || !strings.Contains(err.Error(), "no space left") || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("filling the disk: %v; want an error naming the full disk", err)
	}
	if got := answer(n.Node, "web/a"); got != "drain\n" {
		t.Fatalf("answer with a full disk: %q, want the last applied drain", got)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	kv = map[string]string{"state/web/a": "maint"}
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Expect(n.IsLeader() && n.ApplyKV(ctx, 1000, kv) == nil, "no recovery after space was freed")
	})
	if got := answer(n.Node, "web/a"); got != "maint\n" {
		t.Fatalf("answer after recovery: %q", got)
	}
}
