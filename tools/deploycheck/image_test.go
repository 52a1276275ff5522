package deploycheck

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestImageBuildsAndRuns proves the Dockerfile without a registry or a
// Docker daemon: Debian's buildah (vfs storage, chroot isolation, never
// pulling) builds both targets on base images assembled here from this
// machine's own files, then the test mounts each image's filesystem,
// checks the binary and the image config, and runs the image's entrypoint
// inside that filesystem in front of the built-in simulator:
//
//   - a Go builder: the machine's Go toolchain, gcc and libc6-dev (the
//     files of their Debian packages and dependencies), and a module
//     cache filled from the machine's (GOPROXY=off inside the build);
//   - a glibc runtime: the files of Debian's libc6 (what distroless/base
//     adds to a scratch image), for the default (cgo) target;
//   - an empty static runtime, for the CGO_ENABLED=0 target.
//
// buildah runs as root with chroot isolation: no user namespace is needed.
func TestImageBuildsAndRuns(t *testing.T) {
	buildah := need(t, "buildah")
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("buildah with chroot isolation and vfs storage needs root here")
		}
		t.Skip("SKIPPED: buildah with chroot isolation and vfs storage needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	started := time.Now()
	work := t.TempDir()
	store := []string{"--root", filepath.Join(work, "storage"), "--runroot", filepath.Join(work, "run"), "--storage-driver", "vfs"}
	bh := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, buildah, append(append([]string{}, store...), args...)...)
		cmd.Env = append(os.Environ(), "BUILDAH_ISOLATION=chroot", "STORAGE_DRIVER=vfs")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("buildah %s: %v\n%s\n%s", strings.Join(args, " "), err, tail(out.String()), tail(errb.String()))
		}
		return strings.TrimSpace(out.String())
	}
	t.Cleanup(func() {
		// Unmount and remove everything this store holds before the
		// folder goes.
		exec.Command(buildah, append(append([]string{}, store...), "rm", "--all")...).Run()
		exec.Command(buildah, append(append([]string{}, store...), "rmi", "--all", "--force")...).Run()
	})

	// The base images.
	step := time.Now()
	goroot := strings.TrimSpace(run(t, ctx, "", nil, "go", "env", "GOROOT"))
	bases := map[string]string{
		"localhost/tokentap-ci-go:latest":     assembleBuilder(t, ctx, filepath.Join(work, "go"), goroot),
		"localhost/tokentap-ci-glibc:latest":  assembleRuntime(t, ctx, filepath.Join(work, "glibc"), true),
		"localhost/tokentap-ci-static:latest": assembleRuntime(t, ctx, filepath.Join(work, "static"), false),
	}
	names := make([]string, 0, len(bases))
	for n := range bases {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		bh("bud", "--isolation", "chroot", "--pull=never", "-t", name, "-f", filepath.Join(bases[name], "Containerfile"), bases[name])
	}
	t.Logf("base images assembled from this machine's files: %v (%.0fs)", names, time.Since(step).Seconds())

	// Both targets, from the repository's Dockerfile.
	buildArgs := []string{"--isolation", "chroot", "--pull=never", "--layers",
		"--build-arg", "GO_IMAGE=localhost/tokentap-ci-go:latest",
		"--build-arg", "RUNTIME_IMAGE=localhost/tokentap-ci-glibc:latest",
		"--build-arg", "STATIC_RUNTIME_IMAGE=localhost/tokentap-ci-static:latest",
		"--build-arg", "GOPROXY=off",
		"-f", filepath.Join(root, "Dockerfile")}
	for _, target := range []struct{ name, tag, energyReason string }{
		{"static", "localhost/tokentap:static", "no_cgo"},
		{"runtime", "localhost/tokentap:runtime", "nvml_unavailable"},
	} {
		step := time.Now()
		args := append(append([]string{"bud"}, buildArgs...), "-t", target.tag)
		if target.name != "runtime" {
			args = append(args, "--target", target.name)
		}
		bh(append(args, root)...)
		t.Logf("buildah built the %s target (%.0fs)", target.name, time.Since(step).Seconds())

		// The image's config: non-root, both ports, no HEALTHCHECK.
		var info struct {
			OCIv1 struct {
				Config struct {
					User         string              `json:"User"`
					ExposedPorts map[string]struct{} `json:"ExposedPorts"`
					Entrypoint   []string            `json:"Entrypoint"`
					Env          []string            `json:"Env"`
				} `json:"config"`
			} `json:"OCIv1"`
			Docker struct {
				Config struct {
					Healthcheck any `json:"Healthcheck"`
				} `json:"config"`
			} `json:"Docker"`
		}
		if err := json.Unmarshal([]byte(bh("inspect", "--type", "image", target.tag)), &info); err != nil {
			t.Fatal(err)
		}
		cfg := info.OCIv1.Config
		if cfg.User != "65532:65532" || len(cfg.ExposedPorts) != 2 ||
			!has(cfg.ExposedPorts, "8080/tcp") || !has(cfg.ExposedPorts, "9464/tcp") || info.Docker.Config.Healthcheck != nil || len(cfg.Entrypoint) == 0 {
			t.Errorf("%s image config: user %q, ports %v, entrypoint %v, healthcheck %v", target.name, cfg.User, cfg.ExposedPorts, cfg.Entrypoint, info.Docker.Config.Healthcheck)
		}

		// The image's filesystem: the binary is a glibc (cgo) or a
		// static one.
		ctr := bh("from", "--pull=never", target.tag)
		mnt := bh("mount", ctr)
		bin := filepath.Join(mnt, cfg.Entrypoint[0])
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatalf("%s: the entrypoint %s: %v", target.name, cfg.Entrypoint[0], err)
		}
		interp := ""
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				b, _ := io.ReadAll(p.Open())
				interp = strings.TrimRight(string(b), "\x00")
			}
		}
		f.Close()
		if (target.name == "runtime") != (interp != "") {
			t.Errorf("%s: the binary's interpreter is %q", target.name, interp)
		}
		if interp != "" {
			if _, err := os.Stat(filepath.Join(mnt, interp)); err != nil {
				t.Errorf("%s: the image lacks the binary's interpreter: %v", target.name, err)
			}
		}

		// Run the entrypoint in the image's filesystem, as the image's
		// user, in front of the built-in simulator.
		proxy, admin := freeAddr(t), freeAddr(t)
		runArgs := append(append(append([]string{}, store...), "run", "--isolation", "chroot", "--network", "host", ctr, "--"),
			append(cfg.Entrypoint, "--listen", proxy, "--admin-listen", admin)...)
		cmd := exec.CommandContext(ctx, buildah, runArgs...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		var logs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stopped := false
		stop := func() {
			if !stopped {
				stopped = true
				syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
				done := make(chan struct{})
				go func() { cmd.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(40 * time.Second):
					syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
					<-done
				}
			}
		}
		defer stop()
		if !waitHTTP("http://"+admin+"/healthz", 30*time.Second) {
			stop()
			t.Fatalf("%s: /healthz did not answer 200 in 30 s; the entrypoint's output:\n%s", target.name, tail(logs.String()))
		}
		// Which user runs it: the image's.
		if uid := uidOf(admin); uid != "65532" {
			t.Errorf("%s: the entrypoint runs as uid %q, want 65532", target.name, uid)
		}
		resp, err := http.Post("http://"+proxy+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(body, []byte("[DONE]")) {
			t.Errorf("%s: a streamed request through the image's sidecar: %d %.200s", target.name, resp.StatusCode, body)
		}
		metrics := get("http://" + admin + "/metrics")
		want := fmt.Sprintf(`tokentap_energy_info{reason=%q,state="off"} 1`, target.energyReason)
		if !strings.Contains(metrics, want) || !strings.Contains(metrics, `tokentap_requests_total{gen_ai_operation_name="chat",gen_ai_request_model="m",outcome="success"`) {
			t.Errorf("%s: /metrics lacks %s or the request", target.name, want)
		}
		stop()
		bh("umount", ctr)
		bh("rm", ctr)
		t.Logf("%s image: entrypoint %v as user %s, EXPOSE %v, no HEALTHCHECK, interpreter %q; /healthz 200 and a streamed request through it in front of the simulator; %s",
			target.name, cfg.Entrypoint, cfg.User, keys(cfg.ExposedPorts), interp, want)
	}
	t.Logf("both targets built and run with buildah in %.0fs", time.Since(started).Seconds())
}

// assembleBuilder writes a build context whose image holds the Go
// toolchain, gcc with libc6-dev (the files of their installed Debian
// packages and every package they depend on), dash as /bin/sh, and a
// module cache with every module the repository needs.
func assembleBuilder(t *testing.T, ctx context.Context, dir, goroot string) string {
	rootfs := filepath.Join(dir, "rootfs")
	debFiles(t, ctx, rootfs, "gcc", "gcc-12", "libc6-dev", "dash")
	os.MkdirAll(filepath.Join(rootfs, "usr/local"), 0o755)
	run(t, ctx, "", nil, "sh", "-c", fmt.Sprintf("tar -C %q -cf - --exclude=./test --exclude=./doc --exclude=./api . | (mkdir -p %q && tar -C %q -xf -)",
		goroot, filepath.Join(rootfs, "usr/local/go"), filepath.Join(rootfs, "usr/local/go")))
	// The module cache, from this machine's cache (the network only for
	// what it lacks; in CI the tests ran before and filled it).
	hostCache := strings.TrimSpace(run(t, ctx, "", nil, "go", "env", "GOMODCACHE"))
	run(t, ctx, root, []string{"GOMODCACHE=" + filepath.Join(rootfs, "go/pkg/mod"), "GOFLAGS=-modcacherw",
		"GOPROXY=file://" + filepath.Join(hostCache, "cache/download") + ",https://proxy.golang.org,direct"}, "go", "mod", "download")
	for _, d := range []string{"tmp", "root", "src"} {
		os.MkdirAll(filepath.Join(rootfs, d), 0o1777)
	}
	os.WriteFile(filepath.Join(dir, "Containerfile"), []byte("FROM scratch\nCOPY rootfs/ /\n"+
		"ENV PATH=/usr/local/go/bin:/go/bin:/usr/bin:/bin HOME=/root GOPATH=/go GOTOOLCHAIN=local CC=gcc\n"), 0o644)
	return dir
}

// assembleRuntime writes a build context for a runtime base: with glibc,
// the files of Debian's libc6 (and what it needs); without, nothing but
// /tmp and the non-root user's entries.
func assembleRuntime(t *testing.T, ctx context.Context, dir string, glibc bool) string {
	rootfs := filepath.Join(dir, "rootfs")
	if glibc {
		debFiles(t, ctx, rootfs, "libc6")
	}
	os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755)
	os.MkdirAll(filepath.Join(rootfs, "tmp"), 0o1777)
	os.WriteFile(filepath.Join(rootfs, "etc/passwd"), []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"), 0o644)
	os.WriteFile(filepath.Join(rootfs, "etc/group"), []byte("root:x:0:\nnonroot:x:65532:\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "Containerfile"), []byte("FROM scratch\nCOPY rootfs/ /\n"), 0o644)
	return dir
}

// debFiles copies into rootfs the files (not the docs) of the named
// installed Debian packages and of every installed package they depend
// on, keeping the machine's merged-/usr links.
func debFiles(t *testing.T, ctx context.Context, rootfs string, pkgs ...string) {
	t.Helper()
	os.MkdirAll(filepath.Join(rootfs, "usr"), 0o755)
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		if target, err := os.Readlink("/" + l); err == nil {
			os.MkdirAll(filepath.Join(rootfs, target), 0o755)
			os.Symlink(target, filepath.Join(rootfs, l))
		}
	}
	seen := map[string]bool{}
	todo := append([]string{}, pkgs...)
	for len(todo) > 0 {
		p := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if seen[p] {
			continue
		}
		seen[p] = true
		deps := run(t, ctx, "", nil, "dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}", p)
		for _, alt := range strings.Split(deps, ",") {
			for _, a := range strings.Split(alt, "|") {
				name := regexp.MustCompile(`^[a-z0-9.+-]+`).FindString(strings.TrimSpace(a))
				if name == "" {
					continue
				}
				if st, _ := exec.Command("dpkg-query", "-W", "-f=${Status}", name).Output(); strings.HasSuffix(string(st), " installed") {
					todo = append(todo, name)
					break
				}
			}
		}
	}
	var list bytes.Buffer
	for p := range seen {
		sc := bufio.NewScanner(strings.NewReader(run(t, ctx, "", nil, "dpkg", "-L", p)))
		for sc.Scan() {
			f := sc.Text()
			if strings.HasPrefix(f, "/usr/share/doc") || strings.HasPrefix(f, "/usr/share/man") || strings.HasPrefix(f, "/usr/share/info") || strings.HasPrefix(f, "/usr/share/locale") {
				continue
			}
			if fi, err := os.Lstat(f); err == nil && !fi.IsDir() {
				list.WriteString(strings.TrimPrefix(f, "/") + "\n")
			}
		}
	}
	listFile := rootfs + ".files"
	os.WriteFile(listFile, list.Bytes(), 0o644)
	run(t, ctx, "", nil, "sh", "-c", fmt.Sprintf("tar -C / -cf - -T %q | tar -C %q --keep-directory-symlink -xf -", listFile, rootfs))
}

// run runs a command and returns its standard output, or fails the test.
func run(t *testing.T, ctx context.Context, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, tail(errb.String()))
	}
	return out.String()
}

// uidOf finds the process started with --admin-listen addr and returns
// its real uid.
func uidOf(addr string) string {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "tokentap" && strings.Contains(string(b), addr) {
			st, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "status"))
			if m := regexp.MustCompile(`(?m)^Uid:\s+(\d+)`).FindStringSubmatch(string(st)); m != nil {
				return m[1]
			}
		}
	}
	return ""
}

func waitHTTP(u string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(u); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	return false
}

func get(u string) string {
	resp, err := http.Get(u)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func has(m map[string]struct{}, k string) bool { _, ok := m[k]; return ok }

func keys(m map[string]struct{}) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func tail(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}
