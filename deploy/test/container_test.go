package deploytest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hastate/hastate/internal/testenv"
)

// podman runs podman on a private vfs store under a temporary directory,
// with runc when installed (crun refuses hosts with cgroups in hybrid mode).
type podman struct {
	t     *testing.T
	flags []string
}

func newPodman(t *testing.T) *podman {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman not installed: run scripts/ensure-podman.sh (as root on Debian it installs it), or make test-deploy")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the container test runs podman as root (daemonless, vfs storage): run it as root, as CI does")
	}
	dir := t.TempDir()
	p := &podman{t: t, flags: []string{
		"--storage-driver", "vfs",
		"--root", filepath.Join(dir, "storage"),
		"--runroot", filepath.Join(dir, "run"),
		"--tmpdir", filepath.Join(dir, "tmp"),
		"--events-backend", "file",
	}}
	if _, err := exec.LookPath("runc"); err == nil {
		p.flags = append(p.flags, "--runtime", "runc")
	}
	// Runs after the tests' own container cleanups, before TempDir's: when
	// a container exits, conmon starts "podman container cleanup" in the
	// background, which may still write under dir after "podman rm"
	// returns, and TempDir's single RemoveAll then fails the test with
	// "directory not empty". Remove every container, then retry.
	t.Cleanup(func() {
		_, _ = p.run("rm", "--all", "--force", "--time", "0")
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := os.RemoveAll(dir)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("podman's storage %s is still in use 10s after its containers were removed: %v", dir, err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return p
}

func (p *podman) run(args ...string) (string, error) {
	cmd := exec.Command("podman", append(append([]string{}, p.flags...), args...)...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func (p *podman) must(args ...string) string {
	p.t.Helper()
	out, err := p.run(args...)
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

type replica struct {
	name, container   string
	agent, http, raft string
	dataDir           string
	stopped           bool
}

// TestContainerCluster reads like the runbook, with the image `make image`
// built: three containers of it on the host network (distinct loopback
// ports, a real Consul), each as UID 65532 with a read-only root; a drain
// written to Consul is answered by all three; SIGTERM to the leader hands
// leadership over before it exits 0, and the other two keep answering.
func TestContainerCluster(t *testing.T) {
	p := newPodman(t)
	archive := os.Getenv("HASTATE_IMAGE_ARCHIVE")
	if archive == "" {
		archive = filepath.Join(repoRoot, "bin", "hastate-image.tar")
	}
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("no image archive at %s: build it with make image BASE=scratch (make test-deploy does): %v", archive, err)
	}
	start := time.Now()
	out := p.must("load", "-q", "-i", archive)
	m := regexp.MustCompile(`Loaded image(?:\(s\))?: *(\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("podman load said %q, want the loaded image's name", out)
	}
	image := m[1]
	t.Logf("loaded %s from %s in %s", image, archive, time.Since(start).Round(time.Millisecond))
	if user := p.must("image", "inspect", "-f", "{{.Config.User}}", image); user != "65532:65532" {
		t.Errorf("image USER = %q, want 65532:65532", user)
	}
	labels := p.must("image", "inspect", "-f", "{{json .Labels}}", image)
	for _, l := range []string{"org.opencontainers.image.source", "org.opencontainers.image.revision", "org.opencontainers.image.version"} {
		if !strings.Contains(labels, l) {
			t.Errorf("image lacks label %s: %s", l, labels)
		}
	}

	consul := testenv.StartConsul(t, testenv.ConsulOptions{})
	addr := func() string { return fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) }
	suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1e6)
	rs := make([]*replica, 3)
	var peers []string
	for i := range rs {
		r := &replica{name: fmt.Sprintf("c%d", i), agent: addr(), http: addr(), raft: addr(), dataDir: t.TempDir()}
		r.container = "hastate-e2e-" + r.name + "-" + suffix
		// The data volume belongs to the image's user, as fsGroup makes it in Kubernetes.
		if err := os.Chown(r.dataDir, 65532, 65532); err != nil {
			t.Fatal(err)
		}
		rs[i] = r
		peers = append(peers, r.name+"="+r.raft)
	}
	t.Cleanup(func() {
		for _, r := range rs {
			if t.Failed() {
				logs, _ := p.run("logs", r.container)
				t.Logf("container %s log:\n%s", r.container, logs)
			}
			_, _ = p.run("rm", "-f", "-t", "0", r.container)
		}
	})
	for _, r := range rs {
		p.must("run", "-d", "--name", r.container,
			"--network", "host", "--read-only",
			"--ulimit", "nofile=1024:4096", "--ulimit", "nproc=1024:4096",
			"-v", r.dataDir+":/var/lib/hastate",
			image, "serve",
			"--node-id", r.name,
			"--agent-addr", r.agent, "--http-addr", r.http,
			"--raft-addr", r.raft, "--raft-advertise", r.raft,
			"--peers", strings.Join(peers, ","),
			"--consul-addr", consul.Addr(),
			"--ramp-duration", "0",
			"--shutdown-delay", "1s")
	}
	for _, r := range rs {
		testenv.Eventually(t, 60*time.Second, func() error { return testenv.Expect(get(r.http, "/-/readiness") != "", "%s", r.name+" ready") })
	}
	t.Logf("three containers ready %s after the load", time.Since(start).Round(time.Millisecond))

	// Who runs it, and on what root.
	for _, r := range rs {
		pid := p.must("inspect", "-f", "{{.State.Pid}}", r.container)
		status, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			t.Fatal(err)
		}
		if uid := procField(string(status), "Uid"); !strings.HasPrefix(uid, "65532\t65532") {
			t.Errorf("%s runs as Uid %q, want 65532", r.container, uid)
		}
		if ro := p.must("inspect", "-f", "{{.HostConfig.ReadonlyRootfs}}", r.container); ro != "true" {
			t.Errorf("%s: ReadonlyRootfs = %s, want true", r.container, ro)
		}
	}

	consul.Put(t, "hastate/state/web/a", "drain")
	for _, r := range rs {
		testenv.Eventually(t, 15*time.Second, func() error { return testenv.Expect(probe(r.agent, "web/a") == "drain", "%s", r.name+" answers drain") })
	}

	// SIGTERM to the leader: it hands over, then exits 0.
	leader := clusterView(t, rs[0].http).LeaderID
	var old *replica
	for _, r := range rs {
		if r.name == leader {
			old = r
		}
	}
	if old == nil {
		t.Fatalf("leader %q is none of the containers", leader)
	}
	p.must("kill", "--signal", "TERM", old.container)
	sigterm := time.Now()
	code := p.must("wait", old.container)
	old.stopped = true
	if code != "0" {
		t.Errorf("the old leader exited %s after SIGTERM, want 0", code)
	}
	logs, _ := p.run("logs", old.container)
	if !strings.Contains(logs, "leadership transferred before shutdown") {
		t.Errorf("the old leader's log does not say it handed leadership over")
	}
	for _, r := range rs {
		if r.stopped {
			continue
		}
		testenv.Eventually(t, 10*time.Second, func() error {
			v := clusterView(t, r.http)
			return testenv.Expect(v.LeaderID != "" && v.LeaderID != old.name, "%s", r.name+" follows a new leader")
		})
		if got := probe(r.agent, "web/a"); got != "drain" {
			t.Errorf("%s answers %q after the hand-over, want drain", r.name, got)
		}
	}
	t.Logf("SIGTERM to exit and a new leader in %s (shutdown delay 1s)", time.Since(sigterm).Round(time.Millisecond))

	// The new leader follows Consul.
	consul.Delete(t, "hastate/state/web/a")
	for _, r := range rs {
		if !r.stopped {
			testenv.Eventually(t, 15*time.Second, func() error {
				return testenv.Expect(probe(r.agent, "web/a") == "ready 100%", "%s", r.name+" answers ready")
			})
		}
	}
}

type cluster struct {
	NodeID   string `json:"node_id"`
	State    string `json:"state"`
	LeaderID string `json:"leader_id"`
}

func clusterView(t *testing.T, httpAddr string) cluster {
	t.Helper()
	var c cluster
	if body := get(httpAddr, "/v1/cluster"); body != "" {
		if err := json.Unmarshal([]byte(body), &c); err != nil {
			t.Fatalf("/v1/cluster: %v", err)
		}
	}
	return c
}

// probe asks like HAProxy: one line, one answer line.
func probe(addr, req string) string {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte(req + "\n")); err != nil {
		return ""
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(line, "\n")
}

func procField(status, name string) string {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
