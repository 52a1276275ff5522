package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type runFlags struct {
	sidecar, baseline string
	streams           []int
	duration, warmup  time.Duration
	runs              int
	memory            int
	memDuration       time.Duration
	memInterval       time.Duration
	events            int
	interval          time.Duration
	peers             map[string]bool
	only              map[string]bool
	jaeger            string
	dir               string
	profile           string
	memProfileRate    int
	noOTLPVariant     bool
	toolEvery, keys   int
	livePoll          time.Duration
}

func parseRun(args []string) (runFlags, error) {
	var f runFlags
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.StringVar(&f.sidecar, "sidecar", "", "the sidecar binary (cmd/sidecar); with -profile, a peerbench binary, run as 'BIN sidecar'")
	fs.StringVar(&f.baseline, "baseline", "", "another sidecar binary (the previous commit's), run as tokentap-base with every instrument on; empty: none")
	streams := fs.String("streams", "50,200", "comma-separated stream counts of the table")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "measuring window of each cell")
	fs.DurationVar(&f.warmup, "warmup", 2*time.Second, "warm-up before each window")
	fs.IntVar(&f.runs, "runs", 3, "runs of the whole table (medians are over runs)")
	fs.IntVar(&f.memory, "memory", 1000, "streams of the memory run (0: none)")
	fs.DurationVar(&f.memDuration, "memory-duration", 10*time.Second, "measuring window of the memory run")
	fs.DurationVar(&f.memInterval, "memory-interval", 100*time.Millisecond, "event interval of the memory run (2 cores cannot carry 1,000 streams at 20 ms)")
	peersFlag := fs.String("peers", "nginx,haproxy,caddy", "peers to run when installed")
	only := fs.String("only", "", "comma-separated targets to run (direct, bare, loop, tokentap, tokentap-nethttp, tokentap-nootlp, tokentap-base, nginx, haproxy, caddy); empty: all")
	fs.StringVar(&f.profile, "profile", "", "folder for CPU and allocation profiles of tokentap, taken over each window of the first run, and its heap in the memory run")
	fs.IntVar(&f.memProfileRate, "memprofilerate", 0, "with -profile: the profiled sidecar's runtime.MemProfileRate (1: every allocation sampled, an exact heap breakdown; 0: Go's default)")
	nootlp := fs.Bool("nootlp", true, "also run tokentap with OTLP off (tokentap-nootlp), to state what OTLP adds")
	workloadFlags(fs, &f)
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	f.noOTLPVariant = *nootlp
	errs := f.checkWorkload()
	if f.sidecar == "" {
		errs = append(errs, errors.New("-sidecar is required"))
	}
	for _, s := range strings.Split(*streams, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("-streams: bad count %q", s))
			continue
		}
		f.streams = append(f.streams, n)
	}
	if f.runs < 1 || f.memory < 0 {
		errs = append(errs, errors.New("-runs must be positive, -memory not negative"))
	}
	f.peers, f.only = nameSet(*peersFlag), nameSet(*only)
	return f, errors.Join(errs...)
}

// workloadFlags are the flags run and capacity share: what each stream
// is, what the requests carry, and the live page's poller.
func workloadFlags(fs *flag.FlagSet, f *runFlags) {
	fs.IntVar(&f.events, "events", 200, "events per stream")
	fs.DurationVar(&f.interval, "interval", 20*time.Millisecond, "gap between events")
	fs.IntVar(&f.toolEvery, "tool-every", 4, "every Nth request declares a tool with a JSON schema, answered with a tool call that fits it (checked by the sidecar's structure: required SLO); 0: none")
	fs.IntVar(&f.keys, "keys", 7, "API keys the requests carry in turn (Authorization: Bearer; the sidecar's tenants come from them); 0: none")
	fs.DurationVar(&f.livePoll, "live-poll", time.Second, "a browser stand-in polls each sidecar's /live/data this often while the client runs (the page itself: every 2 s); 0: no poller")
	fs.StringVar(&f.jaeger, "jaeger", "", "Jaeger binary for the OTLP traces (default: jaeger on PATH or in GOPATH/bin; 'none': the built-in sink)")
	fs.StringVar(&f.dir, "dir", "", "work folder for configs, logs, records, captures and profiles (default: a new temporary folder)")
}

func (f *runFlags) checkWorkload() []error {
	var errs []error
	if f.duration <= 0 || f.warmup < 0 || f.events < 1 || f.interval <= 0 {
		errs = append(errs, errors.New("-duration, -events and -interval must be positive, -warmup not negative"))
	}
	if f.toolEvery < 0 || f.keys < 0 || f.livePoll < 0 {
		errs = append(errs, errors.New("-tool-every, -keys and -live-poll must not be negative"))
	}
	return errs
}

func nameSet(s string) map[string]bool {
	m := map[string]bool{}
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			m[x] = true
		}
	}
	return m
}

// cell is one target at one stream count in one run.
type cell struct {
	res    result
	cpu    time.Duration
	rssKiB int64
	side   time.Duration // Jaeger's and the OTLP sink's CPU in the window
	// polls is what the browser stand-in got from the live page, when
	// polled (a sidecar, -live-poll above 0).
	polls  pollStats
	polled bool
	// medianOf, when set, makes the cell stand for the per-figure medians
	// of these runs (printTable).
	medianOf []cell
}

// runCmd runs the whole benchmark and prints the tables.
func runCmd(args []string) error {
	f, err := parseRun(args)
	if err != nil {
		return err
	}
	b, err := newBench(f)
	if err != nil {
		return err
	}
	defer b.close()
	fmt.Printf("# each stream: %d events %s apart; window %s after %s warm-up; %d run(s); work folder %s\n",
		f.events, f.interval, f.duration, f.warmup, f.runs, f.dir)
	b.printSetup()
	bad := b.table()
	if f.memory > 0 {
		if b.memoryRun() {
			bad = true
		}
	}
	if b.finish() {
		bad = true
	}
	if bad {
		return errors.New("some target had errors or no events, or its audit found a problem (see above)")
	}
	return nil
}

// newBench prepares the work folder, starts the upstream, the
// telemetry receivers and every target of f, and prints the machine.
func newBench(f runFlags) (*bench, error) {
	// Raise the descriptor limit for this process and, because it is set
	// explicitly, for its children too (Go would otherwise restore the
	// original soft limit in them).
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	var err error
	if f.dir == "" {
		if f.dir, err = os.MkdirTemp("", "peerbench-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return nil, err
	}
	if f.dir, err = filepath.Abs(f.dir); err != nil {
		return nil, err
	}
	if f.profile != "" {
		if err := os.MkdirAll(f.profile, 0o755); err != nil {
			return nil, err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(f.dir, "tokentap.yaml"), []byte(sidecarConfig(f.dir)), 0o644); err != nil {
		return nil, err
	}
	b := &bench{f: f, self: self}
	if err := b.setup(); err != nil {
		b.close()
		return nil, err
	}
	fmt.Printf("# peerbench: %d cores, %s, %s/%s; %s\n", runtime.NumCPU(), runtime.Version(), runtime.GOOS, runtime.GOARCH, loadavg())
	return b, nil
}

// printSetup says where the telemetry goes, what the requests carry,
// and which paths are missing.
func (b *bench) printSetup() {
	f := b.f
	fmt.Printf("# traces to %s; OTLP metrics to the built-in sink every 10 s\n", b.tracesTo)
	tools := "no request declares a tool"
	if f.toolEvery > 0 {
		tools = fmt.Sprintf("1 request in %d declares a tool (answered with a tool call, checked: structure: required)", f.toolEvery)
	}
	keys := "no API key"
	if f.keys > 0 {
		keys = fmt.Sprintf("%d API keys in turn (tenants from the key)", f.keys)
	}
	live := "the live page not polled"
	if f.livePoll > 0 {
		live = fmt.Sprintf("each sidecar's live page polled every %s", f.livePoll)
	}
	fmt.Printf("# requests: %s; %s; %s; records and capture files per sidecar process\n", tools, keys, live)
	if len(b.missing) > 0 {
		fmt.Printf("# skipped: %s\n", strings.Join(b.missing, ", "))
	}
}

// finish stops every target (each sidecar's files are audited once its
// process has ended), prints the audits and the load, and reports
// whether an audit found a problem.
func (b *bench) finish() (bad bool) {
	for _, t := range b.targets {
		t.down()
	}
	bad = printAudits(os.Stdout, b.targets, b.f.keys > 0)
	fmt.Printf("# done: %s\n", loadavg())
	return bad
}

type bench struct {
	f        runFlags
	self     string
	upstream *proc
	upPort   int
	// refStreams, when set, gives the reference streams the client
	// keeps straight to the upstream beside s streams through a path
	// (load.RefStreams): the capacity's concurrent direct.
	refStreams func(s int) int
	sink       *proc
	jaeger     *proc
	tracesTo   string
	targets    []*target
	missing    []string
}

func (b *bench) close() {
	for _, t := range b.targets {
		t.down()
	}
	b.jaeger.stop()
	b.sink.stop()
	b.upstream.stop()
}

func (b *bench) want(name string) bool { return len(b.f.only) == 0 || b.f.only[name] }

func (b *bench) setup() error {
	f := b.f
	var err error
	if b.upPort, err = b.startUpstream(f.interval); err != nil {
		return err
	}
	// The OTLP sink (metrics; traces too without Jaeger).
	sinkPort, err := freePort()
	if err != nil {
		return err
	}
	if b.sink, err = start(f.dir, "otlp-sink", b.self, []string{"otlp", "-listen", "127.0.0.1:" + itoa(sinkPort)}, nil); err != nil {
		return err
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/v1/metrics", sinkPort)
	b.tracesTo = "the built-in OTLP sink"
	tracesURL := fmt.Sprintf("http://127.0.0.1:%d/v1/traces", sinkPort)
	if jbin := b.jaegerBin(); jbin != "" {
		ports := make([]int, 4)
		for i := range ports {
			if ports[i], err = freePort(); err != nil {
				return err
			}
		}
		cfg := filepath.Join(f.dir, "jaeger.yaml")
		if err := os.WriteFile(cfg, []byte(jaegerConf(ports[0], ports[1], ports[2], ports[3])), 0o644); err != nil {
			return err
		}
		b.jaeger, err = start(f.dir, "jaeger", jbin, []string{"--config", cfg}, nil)
		if err == nil {
			err = waitHTTP(fmt.Sprintf("http://127.0.0.1:%d/api/services", ports[2]), b.jaeger, 90*time.Second)
		}
		if err == nil {
			tracesURL = fmt.Sprintf("http://127.0.0.1:%d/v1/traces", ports[0])
			b.tracesTo = "Jaeger (" + jbin + ", memory storage)"
		} else { // the traces still leave the sidecar, to the sink
			fmt.Fprintf(os.Stderr, "peerbench: jaeger did not start (%v): traces go to the built-in sink\n", err)
			b.jaeger.stop()
			b.jaeger = nil
		}
	}
	otlpEnv := sidecarEnv(tracesURL, metricsURL)

	add := func(t *target) error {
		if !b.want(t.name) {
			return nil
		}
		if t.launch != nil {
			var err error
			if t.port, err = freePort(); err != nil {
				return err
			}
		}
		b.targets = append(b.targets, t)
		return nil
	}
	add(&target{name: "direct", port: b.upPort})
	bare := &target{name: "bare"}
	bare.launch = func() (*proc, error) {
		return start(f.dir, "bare", b.self, []string{"bare", "-listen", "127.0.0.1:" + itoa(bare.port), "-to", "http://127.0.0.1:" + itoa(b.upPort)}, nil)
	}
	if err := add(bare); err != nil {
		return err
	}
	lp := &target{name: "loop"}
	lp.launch = func() (*proc, error) {
		return start(f.dir, "loop", b.self, []string{"loop", "-listen", "127.0.0.1:" + itoa(lp.port), "-to", "127.0.0.1:" + itoa(b.upPort)}, nil)
	}
	if err := add(lp); err != nil {
		return err
	}
	sidecar := func(name, bin string, env []string, profiled bool, extra ...string) error {
		t := &target{name: name}
		admin, err := freePort()
		if err != nil {
			return err
		}
		if profiled {
			pp, err := freePort()
			if err != nil {
				return err
			}
			t.pprof = "127.0.0.1:" + itoa(pp)
		}
		t.admin = "127.0.0.1:" + itoa(admin)
		t.audit = func(gen int) audit {
			records, capture := sidecarFiles(f.dir, name, gen)
			return auditFiles(name, gen, records, capture)
		}
		t.launch = func() (*proc, error) {
			args := append(sidecarArgs(f.dir, name, t.gen, b.upPort, t.port, admin), extra...)
			switch {
			case t.pprof != "":
				pre := []string{"sidecar", "-pprof", t.pprof}
				if f.memProfileRate > 0 {
					pre = append(pre, "-memprofilerate", itoa(f.memProfileRate))
				}
				args = append(append(pre, "--"), args...)
			case f.profile != "" && bin == f.sidecar: // a peerbench binary
				args = append([]string{"sidecar", "--"}, args...)
			}
			return start(f.dir, name, bin, args, env)
		}
		return add(t)
	}
	if err := sidecar("tokentap", f.sidecar, otlpEnv, f.profile != ""); err != nil {
		return err
	}
	if f.noOTLPVariant {
		if err := sidecar("tokentap-nootlp", f.sidecar, nil, false); err != nil {
			return err
		}
	}
	// The sidecar's own binary on net/http's path (--event-loop=false;
	// tokentap is on the event loop, the default), every instrument on;
	// never profiled.
	if err := sidecar("tokentap-nethttp", f.sidecar, otlpEnv, false, "--event-loop=false"); err != nil {
		return err
	}
	if f.baseline != "" {
		if err := sidecar("tokentap-base", f.baseline, otlpEnv, false); err != nil {
			return err
		}
	}
	var ps []peer
	ps, b.missing = installed(f.peers)
	for _, p := range ps {
		t := &target{name: p.name}
		p := p
		t.launch = func() (*proc, error) {
			args, env, err := p.write(f.dir, t.port, b.upPort)
			if err != nil {
				return nil, err
			}
			return start(f.dir, p.name, p.bin, args, env)
		}
		if err := add(t); err != nil {
			return err
		}
	}
	var up []*target
	for _, t := range b.targets {
		if err := t.up(); err != nil {
			if !isPeer(t.name) {
				return err
			}
			// A distribution's proxy that does not start here is
			// reported and left out; the sidecar's paths must start.
			fmt.Fprintf(os.Stderr, "peerbench: %v: left out of the run\n", err)
			b.missing = append(b.missing, t.name+" (did not start)")
			continue
		}
		up = append(up, t)
	}
	b.targets = up
	return nil
}

func isPeer(name string) bool {
	for _, p := range peers {
		if p.name == name {
			return true
		}
	}
	return false
}

func (b *bench) jaegerBin() string {
	switch b.f.jaeger {
	case "none":
		return ""
	case "":
		if p, err := exec.LookPath("jaeger"); err == nil {
			return p
		}
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			if home, err := os.UserHomeDir(); err == nil {
				gopath = filepath.Join(home, "go")
			}
		}
		if p := filepath.Join(gopath, "bin", "jaeger"); gopath != "" {
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p
			}
		}
		return ""
	}
	return b.f.jaeger
}

// startUpstream (re)starts the engine stand-in with the given event
// interval and returns its port.
func (b *bench) startUpstream(interval time.Duration) (int, error) {
	b.upstream.stop()
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	b.upstream, err = start(b.f.dir, "upstream", b.self, []string{"upstream", "-listen", "127.0.0.1:" + itoa(port),
		"-events", itoa(b.f.events), "-interval", interval.String()}, nil)
	if err != nil {
		return 0, err
	}
	return port, waitStream(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), b.upstream, 10*time.Second)
}

// sideCPU is the CPU of the telemetry receivers (not the proxy's).
func (b *bench) sideCPU() time.Duration {
	var d time.Duration
	for _, p := range []*proc{b.jaeger, b.sink} {
		if p != nil {
			d += cpuTime(p.pid())
		}
	}
	return d
}

// measure runs the client through t at s streams.
func (b *bench) measure(t *target, s int, profileTag string) cell {
	var c cell
	var c0, side0 time.Duration
	pid := 0
	if t.p != nil {
		pid = t.p.pid()
	}
	profDone := make(chan struct{})
	close(profDone)
	l := b.load(t, s, b.f.duration)
	l.OnMeasure = func() {
		if pid != 0 {
			c0 = cpuTime(pid)
		}
		side0 = b.sideCPU()
		if t.pprof != "" && profileTag != "" {
			ch := make(chan struct{})
			profDone = ch
			secs := strconv.Itoa(max(1, int(b.f.duration.Seconds())))
			go func() {
				defer close(ch)
				errc := make(chan error, 1)
				go func() {
					errc <- fetch("http://"+t.pprof+"/debug/pprof/allocs?seconds="+secs, filepath.Join(b.f.profile, "allocs-"+profileTag+".pprof"))
				}()
				if err := fetch("http://"+t.pprof+"/debug/pprof/profile?seconds="+secs, filepath.Join(b.f.profile, "cpu-"+profileTag+".pprof")); err != nil {
					fmt.Fprintln(os.Stderr, "peerbench: cpu profile:", err)
				}
				if err := <-errc; err != nil {
					fmt.Fprintln(os.Stderr, "peerbench: allocs profile:", err)
				}
			}()
		}
	}
	l.OnEnd = func() {
		if pid != 0 {
			c.cpu = cpuTime(pid) - c0
			c.rssKiB = rssKiB(pid)
		}
		c.side = b.sideCPU() - side0
	}
	polls := b.poll(t, &l)
	c.res = l.run()
	if polls != nil {
		c.polls, c.polled = <-polls, true
	}
	<-profDone
	return c
}

// load is the client's load through t at s streams.
func (b *bench) load(t *target, s int, window time.Duration) load {
	l := load{URL: t.url(), Streams: s, Duration: window, Warmup: b.f.warmup, ToolEvery: b.f.toolEvery}
	if b.f.keys > 0 {
		l.Keys = apiKeys(b.f.keys)
	}
	if b.refStreams != nil {
		l.RefStreams = b.refStreams(s)
		l.RefURL = fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", b.upPort)
	}
	return l
}

// poll starts the browser stand-in on t's live page, when t has one
// and -live-poll asks for it, until l's window ends; the channel
// receives what it got. nil: no poller.
func (b *bench) poll(t *target, l *load) <-chan pollStats {
	if t.admin == "" || b.f.livePoll <= 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan pollStats, 1)
	go func() { ch <- browser{Admin: t.admin, Every: b.f.livePoll}.run(ctx) }()
	end := l.OnEnd
	l.OnEnd = func() {
		if end != nil {
			end()
		}
		cancel()
	}
	return ch
}

// table runs every target at every stream count, f.runs times, and
// prints each run and the medians. It reports whether a cell had errors
// or no events.
func (b *bench) table() (bad bool) {
	f := b.f
	// cells[run][streams index][target index]
	cells := make([][][]cell, f.runs)
	for r := range f.runs {
		cells[r] = make([][]cell, len(f.streams))
		for si, s := range f.streams {
			cells[r][si] = make([]cell, len(b.targets))
			// Rotate the order from run to run, so that a drift of the
			// machine's load does not always hit the same target.
			for k := range b.targets {
				ti := (k + r) % len(b.targets)
				t := b.targets[ti]
				if err := t.up(); err != nil { // restarted if it died
					fmt.Fprintln(os.Stderr, "peerbench:", err)
					bad = true
					continue
				}
				tag := ""
				if r == 0 && t.pprof != "" {
					tag = strconv.Itoa(s) + "streams"
				}
				cells[r][si][ti] = b.measure(t, s, tag)
				time.Sleep(500 * time.Millisecond) // let the connections close
			}
			printTable(os.Stdout, fmt.Sprintf("run %d of %d, %d streams", r+1, f.runs, s), b.targets, cells[r][si], f.duration)
		}
	}
	for si, s := range f.streams {
		med := make([]cell, len(b.targets))
		for ti := range b.targets {
			var runs []cell
			for r := range f.runs {
				runs = append(runs, cells[r][si][ti])
			}
			med[ti] = medianCell(runs)
		}
		if f.runs > 1 {
			printTable(os.Stdout, fmt.Sprintf("median of %d runs, %d streams", f.runs, s), b.targets, med, f.duration)
		}
		printRatios(os.Stdout, s, b.targets, cells, si, f.duration)
	}
	for r := range f.runs {
		for si := range f.streams {
			for ti, t := range b.targets {
				c := cells[r][si][ti]
				if c.res.Errors > 0 || c.res.Events == 0 {
					fmt.Printf("# WARNING: run %d, %d streams, %s: %d errors %v, %d events\n", r+1, f.streams[si], t.name, c.res.Errors, c.res.ErrKinds, c.res.Events)
					bad = bad || strict(t.name, c.res)
				}
				if c.polled && (c.polls.Polls == 0 || c.polls.Errors > 0) {
					fmt.Printf("# WARNING: run %d, %d streams, %s: the live page answered %d polls, %d errors (%s)\n", r+1, f.streams[si], t.name, c.polls.Polls, c.polls.Errors, c.polls.FirstErr)
					bad = true
				}
			}
		}
	}
	return bad
}

// memoryRun starts each proxy afresh, reads its idle RSS, then holds
// f.memory streams through it and samples its RSS; the increase divided
// by the streams is its memory per in-flight stream.
func (b *bench) memoryRun() (bad bool) {
	f := b.f
	for _, t := range b.targets {
		t.down()
	}
	var err error
	if b.upPort, err = b.startUpstream(f.memInterval); err != nil {
		fmt.Fprintln(os.Stderr, "peerbench: memory run:", err)
		return true
	}
	var rows []memRow
	for _, t := range b.targets {
		if t.launch == nil {
			continue
		}
		if err := t.up(); err != nil {
			fmt.Fprintln(os.Stderr, "peerbench: memory run:", err)
			bad = true
			continue
		}
		time.Sleep(time.Second)
		row := memRow{name: t.name, idle: rssKiB(t.p.pid())}
		stop := make(chan struct{})
		sampled := make(chan struct{})
		l := b.load(t, f.memory, f.memDuration)
		l.Warmup = max(f.warmup, 3*time.Second)
		l.OnMeasure = func() {
			go func() {
				defer close(sampled)
				tick := time.NewTicker(250 * time.Millisecond)
				defer tick.Stop()
				for {
					if r := rssKiB(t.p.pid()); r > row.peak {
						row.peak = r
					}
					select {
					case <-stop:
						return
					case <-tick.C:
					}
				}
			}()
		}
		l.OnEnd = func() { close(stop); <-sampled }
		if t.pprof != "" {
			// The heap (after a collection, and the runtime's memory
			// statistics) and the goroutines halfway through the window,
			// with every stream in flight: where the memory per stream
			// goes.
			measure, profiled := l.OnMeasure, make(chan struct{})
			l.OnMeasure = func() {
				measure()
				go func() {
					defer close(profiled)
					time.Sleep(f.memDuration / 2)
					for _, p := range [][2]string{
						{"heap?gc=1", "heap-memory.pprof"},
						{"heap?debug=1", "heap-memory.txt"},
						{"goroutine?debug=1", "goroutines-memory.txt"},
					} {
						if err := fetch("http://"+t.pprof+"/debug/pprof/"+p[0], filepath.Join(f.profile, p[1])); err != nil {
							fmt.Fprintln(os.Stderr, "peerbench: memory profile:", err)
						}
					}
				}()
			}
			end := l.OnEnd
			l.OnEnd = func() { end(); <-profiled }
		}
		polls := b.poll(t, &l)
		row.res = l.run()
		if polls != nil {
			if p := <-polls; p.Polls == 0 || p.Errors > 0 {
				fmt.Printf("# WARNING: memory run, %s: the live page answered %d polls, %d errors (%s)\n", t.name, p.Polls, p.Errors, p.FirstErr)
				bad = true
			}
		}
		rows = append(rows, row)
		if row.res.Errors > 0 || row.res.Events == 0 {
			fmt.Printf("# WARNING: memory run, %s: %d errors %v, %d events\n", t.name, row.res.Errors, row.res.ErrKinds, row.res.Events)
			bad = bad || strict(t.name, row.res)
		}
		t.down() // free the machine for the next one
	}
	printMemory(os.Stdout, f.memory, f.memInterval, rows)
	return bad
}

// strict reports whether a cell's result fails the run: no events at
// all, or an error through the sidecar. The peers' errors are reported
// and not failed on: a bare httputil.ReverseProxy that forwards the
// client's request body as it is loses a few streams under this load
// ("use of closed network connection" on its upstream connection, in its
// log), and so does the shared harness's; the sidecar, which reads the
// body before forwarding it, does not.
func strict(name string, r result) bool {
	return r.Events == 0 || (strings.HasPrefix(name, "tokentap") && r.Errors > 0)
}

type memRow struct {
	name       string
	idle, peak int64
	res        result
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load average unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "load average unknown"
	}
	return "load average " + strings.Join(f[:3], " ")
}
