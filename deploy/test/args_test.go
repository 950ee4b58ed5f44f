package deploytest

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
	corev1 "k8s.io/api/core/v1"
)

// hastateBin is the binary the tests run: $HASTATE_BIN (make passes
// bin/hastate), else one built from the repository by TestMain.
var hastateBin string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	hastateBin = os.Getenv("HASTATE_BIN")
	if hastateBin == "" {
		dir, err := os.MkdirTemp("", "hastate-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		hastateBin = filepath.Join(dir, "hastate")
		cmd := exec.Command("go", "build", "-o", hastateBin, "./cmd/hastate")
		cmd.Dir = repoRoot
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build hastate:", err)
			return 1
		}
	}
	return m.Run()
}

// TestChartArgsStartHastate feeds the rendered StatefulSet's args and env to
// hastate itself, as the kubelet would for pod t-hastate-0: $(VAR)s
// expanded, the volumes' files in place (the raft TLS files of an
// existingSecret, written where the Secret volume's items put them). hastate has no parse-only flag, so it really
// starts; to keep to loopback, flags appended after the chart's (the last
// one wins) move the listeners to 127.0.0.1 and dial the other replicas
// and Consul at closed loopback ports. Every other flag, --peers and
// --raft-advertise with their Kubernetes host names included, is the
// chart's. It must get past flag parsing and validation (a usage error
// exits 2 at once), answer /-/liveness, export hastate_raft_tls_enabled 1,
// and stop on SIGTERM.
func TestChartArgsStartHastate(t *testing.T) {
	for name, vals := range map[string]string{
		// The certificates of a Secret (every replica's, projected).
		"existingSecret": "consul: {token: s3cr3t}\nraftTLS: {existingSecret: raft-certs}",
		// This pod's own certificate from cert-manager's csi-driver, the
		// trusted CAs from a bundle mounted beside it.
		"csiDriver+trustBundle": "consul: {token: s3cr3t}\nraftTLS: {certManager: {enabled: true, csiDriver: {enabled: true}}, trustBundle: {configMap: raft-trust}}",
	} {
		t.Run(name, func(t *testing.T) { chartArgsStartHastate(t, vals) })
	}
}

func chartArgsStartHastate(t *testing.T, vals string) {
	r := render(t, loadChart(t, chartDir), values(t, vals))
	ss, c := statefulSet(t, r)
	pod := "t-hastate-0"

	// The volumes, as files.
	paths := map[string]string{} // mountPath → local dir
	cert, key, ca := testenv.WriteRaftTLS(t, t.TempDir())
	for _, m := range c.VolumeMounts {
		dir := t.TempDir()
		paths[m.MountPath] = dir
		switch m.Name {
		case "raft-tls", "raft-trust":
			writeRaftVolume(t, volume(ss, m.Name), dir, cert, key, ca)
		case "consul-token":
			writeRenderedSecretVolume(t, r, volume(ss, m.Name), dir)
		}
	}
	// One pass, longest mount path first: a local dir is itself under
	// /tmp, which may be a mount path too, and must not be rewritten again.
	mounts := slices.SortedFunc(maps.Keys(paths), func(a, b string) int { return len(b) - len(a) })
	var pairs []string
	for _, mp := range mounts {
		pairs = append(pairs, mp+"/", paths[mp]+"/")
	}
	mounted := strings.NewReplacer(pairs...)
	expand := func(s string) string {
		s = strings.ReplaceAll(s, "$(POD_NAME)", pod)
		s = strings.ReplaceAll(s, "$(POD_NAMESPACE)", "ops")
		orig := s
		s = mounted.Replace(s)
		for _, mp := range mounts {
			if strings.HasSuffix(orig, "="+mp) {
				s = strings.TrimSuffix(orig, mp) + paths[mp]
			}
		}
		return s
	}
	var args []string
	for _, a := range c.Args {
		args = append(args, expand(a))
	}
	env := []string{"POD_NAME=" + pod, "POD_NAMESPACE=ops", "PATH=/usr/bin:/bin"}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+expand(e.Value))
		}
	}
	closed := func() string { return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) }
	httpAddr := closed()
	args = append(args,
		"--agent-addr", closed(), "--http-addr", httpAddr, "--raft-addr", closed(),
		"--raft-dial", "t-hastate-1="+closed()+",t-hastate-2="+closed(),
		"--consul-addr", closed())

	var out bytes.Buffer
	cmd := exec.Command(hastateBin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("hastate %s\n%s", strings.Join(args, " "), out.String())
		}
	})

	metrics := ""
	deadline := time.Now().Add(30 * time.Second)
	for metrics == "" {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("hastate exited with the chart's args: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("hastate did not answer /-/liveness within 30s")
		}
		if get(httpAddr, "/-/liveness") != "" {
			metrics = get(httpAddr, "/-/metrics")
		}
	}
	if !strings.Contains(metrics, "hastate_raft_tls_enabled 1") {
		t.Errorf("hastate_raft_tls_enabled is not 1 with the chart's certificates")
	}
	// The chart's --shutdown-delay (29s) holds the first SIGTERM; a second
	// one cuts it short.
	_ = cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(200 * time.Millisecond)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Errorf("hastate exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("hastate did not exit within 30s of two SIGTERMs")
	}
}

// get returns the body of a 200 answer, else "".
func get(addr, path string) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(b)
}

// writeSecretVolume writes the items of the existingSecret volume into dir,
// as the kubelet would, from a test CA: ca.crt, and a certificate and key
// for every <pod>.crt / <pod>.key item.
// writeRaftVolume writes a raft TLS volume's files into dir as the kubelet
// (or cert-manager's csi-driver) would: the items of raftTLS.existingSecret
// (projected), the csi-driver's tls.crt, tls.key and ca.crt, or a trust
// bundle's ca.crt. cert, key and ca are the files to write.
func writeRaftVolume(t *testing.T, v *corev1.Volume, dir, cert, key, ca string) {
	t.Helper()
	files := map[string]string{} // path in the volume → source
	switch {
	case v != nil && v.CSI != nil && v.CSI.Driver == "csi.cert-manager.io":
		files = map[string]string{"tls.crt": cert, "tls.key": key, "ca.crt": ca}
	case v != nil && v.ConfigMap != nil && len(v.ConfigMap.Items) == 1:
		files[v.ConfigMap.Items[0].Path] = ca
	case v != nil && v.Projected != nil && len(v.Projected.Sources) == 1 && v.Projected.Sources[0].Secret != nil && v.Projected.Sources[0].Secret.Name == "raft-certs":
		from := map[string]string{".crt": cert, ".key": key}
		for _, it := range v.Projected.Sources[0].Secret.Items {
			files[it.Path] = from[filepath.Ext(it.Key)]
			if it.Key == "ca.crt" {
				files[it.Path] = ca
			}
		}
	default:
		t.Fatalf("volume %+v: want the Secret of raftTLS.existingSecret (projected), the csi-driver's or a trust bundle's", v)
	}
	for path, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if err := os.WriteFile(filepath.Join(dir, path), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// writeRenderedSecretVolume writes the items of a Secret volume whose
// Secret the chart renders (the Consul token from consul.token) into dir,
// as the kubelet would.
func writeRenderedSecretVolume(t *testing.T, r *Rendered, v *corev1.Volume, dir string) {
	t.Helper()
	if v == nil || v.Secret == nil {
		t.Fatalf("volume %+v: want a Secret volume", v)
	}
	sec := r.get(t, "Secret", v.Secret.SecretName).(*corev1.Secret)
	for _, it := range v.Secret.Items {
		b, ok := sec.Data[it.Key]
		if !ok {
			t.Fatalf("Secret %s has no key %s the volume names", sec.Name, it.Key)
		}
		if err := os.WriteFile(filepath.Join(dir, it.Path), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
