package config

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// Live configures the admin port's live page (docs/live.md).
type Live struct {
	// Enabled serves /live and /live/data; true by default (the admin
	// port listens on loopback unless admin_listen says otherwise).
	Enabled bool `yaml:"enabled"`
	// Requests is how many finished requests the page keeps and draws:
	// 1 to MaxLiveRequests; 0 means 100.
	Requests int `yaml:"requests"`
	// Resolution is the length of one point of the page's 15-minute
	// figures: 1s to 10s; 0 means 5s.
	Resolution time.Duration `yaml:"resolution"`
}

// MaxLiveRequests bounds live.requests: each kept record holds its
// token instants (12 bytes a token event).
const MaxLiveRequests = 1000

// Demo configures the first run's demonstration (docs/live.md, "The
// first run"): with the built-in simulator and no configuration file, a
// demo SLO, a demo price and a gentle open-loop load, every one flagged
// synthetic. Never in front of a real engine.
type Demo struct {
	// Enabled is auto (the default: on with the built-in simulator and
	// no configuration file) or off.
	Enabled string `yaml:"enabled"`
	// Rate is the demo load's mean arrival rate, requests per second
	// (Poisson arrivals): above 0, at most MaxDemoRate; 0 means 3.
	Rate float64 `yaml:"rate"`
}

// MaxDemoRate bounds demo.rate: the demo is a gentle load, not a
// benchmark.
const MaxDemoRate = 20

// LiveDefaults returns the live page's defaults.
func LiveDefaults() Live { return Live{Enabled: true, Requests: 100, Resolution: 5 * time.Second} }

// DemoDefaults returns the demo's defaults.
func DemoDefaults() Demo { return Demo{Enabled: "auto", Rate: 3} }

func (c *Live) bind(fs *flag.FlagSet) {
	fs.BoolVar(&c.Enabled, "live", c.Enabled, "serve the live page, /live, on the admin port")
	fs.IntVar(&c.Requests, "live.requests", c.Requests, fmt.Sprintf("finished requests the live page keeps and draws (1 to %d)", MaxLiveRequests))
	fs.DurationVar(&c.Resolution, "live.resolution", c.Resolution, "length of one point of the live page's 15-minute figures (1s to 10s)")
}

func (c *Demo) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Enabled, "demo", c.Enabled, "first-run demo with the built-in simulator and no config file (demo SLO, demo price, demo load, all flagged synthetic): auto or off")
	fs.Float64Var(&c.Rate, "demo.rate", c.Rate, fmt.Sprintf("demo load: mean requests per second, open loop (above 0, at most %d)", MaxDemoRate))
}

// Validate returns one error per problem.
func (c Live) Validate() []error {
	var errs []error
	if c.Requests < 0 || c.Requests > MaxLiveRequests {
		errs = append(errs, fmt.Errorf("live.requests: %d is not within 0 to %d", c.Requests, MaxLiveRequests))
	}
	if c.Resolution != 0 && (c.Resolution < time.Second || c.Resolution > 10*time.Second) {
		errs = append(errs, fmt.Errorf("live.resolution: %v is not within 1s to 10s", c.Resolution))
	}
	return errs
}

// Validate returns one error per problem.
func (c Demo) Validate() []error {
	var errs []error
	if c.Enabled != "auto" && c.Enabled != "off" && c.Enabled != "" {
		errs = append(errs, fmt.Errorf("demo.enabled: %q is neither auto nor off", c.Enabled))
	}
	if c.Rate < 0 || c.Rate > MaxDemoRate || c.Rate != c.Rate {
		errs = append(errs, errors.New("demo.rate: must be above 0 and at most 20 requests per second"))
	}
	return errs
}

// DemoOn reports whether the first-run demo runs: demo.enabled auto, the
// built-in simulator (no upstream) and no configuration file.
func (c *Config) DemoOn() bool {
	return c.Demo.Enabled != "off" && c.Upstream == "" && c.File == ""
}
