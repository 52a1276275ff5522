package main

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strings"
)

// The plot's size: four panels stacked, one per series, sharing the
// time axis (minutes). The drawing follows capture/cli/plot.go's (the
// same 3×5 pixel font, a subset of it here); both could share one
// internal package.
const (
	plotW, plotH   = 960, 1000
	marginL        = 90
	marginR        = 20
	panelTop       = 30
	panelH         = 235
	panelGap       = 5
	scale          = 2 // font pixels per glyph pixel
	glyphW, glyphH = 3, 5
)

var (
	white  = color.RGBA{255, 255, 255, 255}
	ink    = color.RGBA{40, 40, 40, 255}
	gridC  = color.RGBA{225, 225, 225, 255}
	warmC  = color.RGBA{250, 235, 215, 255}
	lineC  = color.RGBA{31, 119, 180, 255}
	fitC   = color.RGBA{255, 127, 14, 255}
	panels = []struct {
		title string
		v     func(sample) float64
	}{
		{"RSS (MIB)", func(s sample) float64 { return s.RSS / mib }},
		{"HEAP IN USE (MIB)", func(s sample) float64 { return s.HeapInuse / mib }},
		{"GOROUTINES", func(s sample) float64 { return s.Goroutines }},
		{"OPEN FDS", func(s sample) float64 { return s.FDs }},
	}
)

// plot draws the samples as a PNG: per panel the series (blue), the
// warm-up shaded, and the least-squares line over the samples after it
// (orange), with its slope per hour in the title.
func plot(w io.Writer, samples []sample, warm float64) error {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	fill(img, img.Bounds(), white)
	tEnd := 1.0
	if len(samples) > 0 {
		tEnd = max(samples[len(samples)-1].Elapsed, 1)
	}
	text(img, marginL, 8, fmt.Sprintf("TOKENTAP SOAK: %d SAMPLES OVER %.1f MIN, FIT AFTER %.1f MIN", len(samples), tEnd/60, warm/60), ink)
	for i, p := range panels {
		top := panelTop + i*(panelH+panelGap)
		area := image.Rect(marginL, top+14, plotW-marginR, top+panelH-20)
		// Every axis starts at 0: a flat series looks flat, and the
		// fitted slope is in the title.
		lo, hi := 0.0, 0.0
		var xs, ys []float64
		for _, s := range samples {
			v := p.v(s)
			hi = max(hi, v)
			if s.Elapsed >= warm {
				xs, ys = append(xs, s.Elapsed), append(ys, v)
			}
		}
		hi = max(hi*1.1, 1)
		x := func(t float64) int { return area.Min.X + int(math.Round(t/tEnd*float64(area.Dx()-1))) }
		y := func(v float64) int { return area.Max.Y - 1 - int(math.Round((v-lo)/(hi-lo)*float64(area.Dy()-1))) }
		fill(img, image.Rect(area.Min.X, area.Min.Y, x(min(warm, tEnd)), area.Max.Y), warmC)
		for g := 1; g < 4; g++ {
			gy := area.Min.Y + area.Dy()*g/4
			fill(img, image.Rect(area.Min.X, gy, area.Max.X, gy+1), gridC)
		}
		fill(img, image.Rect(area.Min.X-1, area.Min.Y, area.Min.X, area.Max.Y+1), ink)
		fill(img, image.Rect(area.Min.X-1, area.Max.Y, area.Max.X, area.Max.Y+1), ink)
		for j := 1; j < len(samples); j++ {
			a, b := samples[j-1], samples[j]
			drawLine(img, x(a.Elapsed), y(p.v(a)), x(b.Elapsed), y(p.v(b)), lineC)
		}
		title := p.title
		if len(xs) >= 2 {
			f := lsq(xs, ys)
			title += fmt.Sprintf("   FIT %+.3g /H", f.Slope*secondsPerHr)
			drawLine(img, x(xs[0]), y(f.Intercept+f.Slope*xs[0]), x(xs[len(xs)-1]), y(f.Intercept+f.Slope*xs[len(xs)-1]), fitC)
		}
		text(img, area.Min.X, top, title, ink)
		for g := 0; g <= 4; g++ {
			l := label(lo + (hi-lo)*float64(g)/4)
			text(img, area.Min.X-6-textWidth(l), y(lo+(hi-lo)*float64(g)/4)-glyphH*scale/2, l, ink)
		}
		for m := 0.0; m <= tEnd/60; m += minuteStep(tEnd / 60) {
			l := fmt.Sprintf("%.1f", m)
			if m == math.Trunc(m) {
				l = fmt.Sprintf("%.0f", m)
			}
			text(img, x(m*60)-textWidth(l)/2, area.Max.Y+5, l, ink)
		}
	}
	text(img, plotW/2-textWidth("MINUTES")/2, plotH-14, "MINUTES", ink)
	return png.Encode(w, img)
}

// minuteStep is the time axis' tick step: about 6 to 12 ticks.
func minuteStep(total float64) float64 {
	for _, s := range []float64{0.5, 1, 2, 5, 10, 15, 30, 60} {
		if total/s <= 12 {
			return s
		}
	}
	return 120
}

// label prints v in at most 6 characters where it can.
func label(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// drawLine draws a 2-pixel line from (x0, y0) to (x1, y1).
func drawLine(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	n := max(abs(x1-x0), abs(y1-y0), 1)
	for i := 0; i <= n; i++ {
		x, y := x0+(x1-x0)*i/n, y0+(y1-y0)*i/n
		fill(img, image.Rect(x, y, x+2, y+2), c)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func textWidth(s string) int { return len(s) * (glyphW + 1) * scale }

// text draws s upper-cased with its top left at (x, y); a character
// the font lacks is drawn as a blank.
func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, ch := range strings.ToUpper(s) {
		g := glyphs[ch]
		for i := range glyphW * glyphH {
			if g&(1<<(glyphW*glyphH-1-i)) != 0 {
				px, py := x+(i%glyphW)*scale, y+(i/glyphW)*scale
				fill(img, image.Rect(px, py, px+scale, py+scale), c)
			}
		}
		x += (glyphW + 1) * scale
	}
}

// glyphs are 3×5 pixel characters, 15 bits row by row from the top
// left (capture/cli's, as bits).
var glyphs = map[rune]uint16{
	'0': 0x7b6f, '1': 0x2c97, '2': 0x73e7, '3': 0x73cf, '4': 0x5bc9, '5': 0x79cf, '6': 0x79ef, '7': 0x7252,
	'8': 0x7bef, '9': 0x7bcf, '.': 0x0002, '-': 0x01c0, '+': 0x05d0, ':': 0x0410, '/': 0x12a4, '%': 0x52a5,
	' ': 0x0000, '(': 0x2922, ')': 0x224a, ',': 0x0014, 'A': 0x2bed, 'B': 0x6bae, 'C': 0x3923, 'D': 0x6b6e, 'E': 0x79a7,
	'F': 0x79a4, 'G': 0x396b, 'H': 0x5bed, 'I': 0x7497, 'K': 0x5bad, 'L': 0x4927, 'M': 0x5fed, 'N': 0x6b6d,
	'O': 0x2b6a, 'P': 0x6ba4, 'R': 0x6bad, 'S': 0x388e, 'T': 0x7492, 'U': 0x5b6f, 'V': 0x5b6a, 'W': 0x5bfd,
	'X': 0x5aad, 'Y': 0x5a92,
}
