package cli

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"strings"
)

// The plot is drawn by hand with the standard library (no font or
// plotting module): three panels, each titled in a 3×5 pixel font.
const (
	plotW, plotH = 960, 720
	panelH       = 200
	marginL      = 70
	marginR      = 20
	fontScale    = 2
)

var (
	white  = color.RGBA{255, 255, 255, 255}
	ink    = color.RGBA{40, 40, 40, 255}
	grid   = color.RGBA{220, 220, 220, 255}
	blue   = color.RGBA{49, 110, 190, 255}
	orange = color.RGBA{230, 130, 30, 255}
	green  = color.RGBA{60, 160, 80, 255}
)

// plot draws r: the arrival rate over time; the ideal cache's hit share
// by size beside the reuse (the bound of a cache without limit); each
// replica's reuse, within (blue) and across replicas (orange).
func plot(w io.Writer, r *Report) error {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	fill(img, img.Bounds(), white)
	text(img, 10, 8, fmt.Sprintf("TRACE %s: %d REQUESTS, %.1f S, BLOCKS OF %d TOKENS", r.File, r.Requests, r.DurationS, r.BlockSize), ink)

	// Panel 1: arrivals.
	top := 40
	peak := 0.0
	for _, c := range r.Arrivals.Counts {
		peak = max(peak, float64(c)/r.Arrivals.BinS)
	}
	text(img, 10, top, fmt.Sprintf("ARRIVAL RATE (REQ/S) IN %g S BINS: PEAK %.2f, MEAN %.2f", r.Arrivals.BinS, peak, r.Arrivals.MeanRPS), ink)
	area := image.Rect(marginL, top+20, plotW-marginR, top+20+panelH-50)
	axes(img, area, fmt.Sprintf("%.4g", peak), "0")
	if n := len(r.Arrivals.Counts); n > 0 && peak > 0 {
		bw := float64(area.Dx()) / float64(n)
		for i, c := range r.Arrivals.Counts {
			h := int(float64(area.Dy()) * float64(c) / r.Arrivals.BinS / peak)
			x0 := area.Min.X + int(float64(i)*bw)
			x1 := max(area.Min.X+int(float64(i+1)*bw)-1, x0+1)
			fill(img, image.Rect(x0, area.Max.Y-h, x1, area.Max.Y), blue)
		}
	}
	text(img, area.Max.X-60, area.Max.Y+6, fmt.Sprintf("%.1f S", r.DurationS), ink)

	// Panel 2: the ideal cache by size.
	top += panelH + 20
	text(img, 10, top, fmt.Sprintf("IDEAL LRU CACHE: SHARE OF BLOCKS HIT BY SIZE (BLOCKS); GREEN: REUSE %s", pct(r.Reuse.Share)), ink)
	area = image.Rect(marginL, top+20, plotW-marginR, top+20+panelH-50)
	axes(img, area, "100%", "0%")
	y := func(s float64) int { return area.Max.Y - int(float64(area.Dy())*s) }
	for x := area.Min.X; x < area.Max.X; x += 6 {
		fill(img, image.Rect(x, y(r.Reuse.Share), x+3, y(r.Reuse.Share)+2), green)
	}
	if n := len(r.IdealCache); n > 0 {
		step := area.Dx() / n
		prevX, prevY := -1, -1
		for i, c := range r.IdealCache {
			x, yy := area.Min.X+step*i+step/2, y(c.Share)
			if prevX >= 0 {
				drawLine(img, prevX, prevY, x, yy, orange)
			}
			fill(img, image.Rect(x-3, yy-3, x+4, yy+4), orange)
			label := fmt.Sprintf("%d", c.SizeBlocks)
			text(img, x-textWidth(label)/2, area.Max.Y+6, label, ink)
			text(img, x+6, yy-14, pct(c.Share), ink)
			prevX, prevY = x, yy
		}
	}

	// Panel 3: reuse per replica.
	top += panelH + 20
	text(img, 10, top, fmt.Sprintf("REUSE PER REPLICA: BLUE WITHIN %s, ORANGE ACROSS REPLICAS %s", pct(r.Reuse.WithinShare), pct(r.Reuse.AcrossShare)), ink)
	area = image.Rect(marginL, top+20, plotW-marginR, top+20+panelH-30)
	axes(img, area, "100%", "0%")
	reps := r.Replicas
	if len(reps) > 64 {
		reps = reps[:64]
	}
	if n := len(reps); n > 0 {
		step := area.Dx() / n
		for i, p := range reps {
			x0 := area.Min.X + step*i + step/8
			x1 := max(area.Min.X+step*(i+1)-step/8, x0+1)
			yw := y(p.WithinShare)
			fill(img, image.Rect(x0, yw, x1, area.Max.Y), blue)
			fill(img, image.Rect(x0, y(p.WithinShare+p.AcrossShare), x1, yw), orange)
			if n <= 16 {
				label := p.Name
				if len(label) > step/(4*fontScale) {
					label = label[len(label)-max(step/(4*fontScale), 1):]
				}
				text(img, x0, area.Max.Y+6, label, ink)
			}
		}
	}
	return png.Encode(w, img)
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// axes draws a panel's frame, grid and its top and bottom labels.
func axes(img *image.RGBA, a image.Rectangle, topLabel, bottomLabel string) {
	for i := 1; i < 4; i++ {
		y := a.Min.Y + a.Dy()*i/4
		fill(img, image.Rect(a.Min.X, y, a.Max.X, y+1), grid)
	}
	fill(img, image.Rect(a.Min.X-1, a.Min.Y, a.Min.X, a.Max.Y+1), ink)
	fill(img, image.Rect(a.Min.X-1, a.Max.Y, a.Max.X, a.Max.Y+1), ink)
	text(img, a.Min.X-6-textWidth(topLabel), a.Min.Y, topLabel, ink)
	text(img, a.Min.X-6-textWidth(bottomLabel), a.Max.Y-5*fontScale, bottomLabel, ink)
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

func textWidth(s string) int { return len(s) * 4 * fontScale }

// text draws s (upper-cased; unknown characters as '?') with its top
// left at (x, y).
func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, ch := range strings.ToUpper(s) {
		g, ok := glyphs[ch]
		if !ok {
			g = glyphs['?']
		}
		for i := range 15 {
			if g[i] == '1' {
				px, py := x+(i%3)*fontScale, y+(i/3)*fontScale
				fill(img, image.Rect(px, py, px+fontScale, py+fontScale), c)
			}
		}
		x += 4 * fontScale
	}
}

// glyphs are 3×5 pixel characters, row by row.
var glyphs = map[rune]string{
	'0': "111101101101111", '1': "010110010010111", '2': "111001111100111", '3': "111001111001111",
	'4': "101101111001001", '5': "111100111001111", '6': "111100111101111", '7': "111001001010010",
	'8': "111101111101111", '9': "111101111001111",
	'A': "010101111101101", 'B': "110101110101110", 'C': "011100100100011", 'D': "110101101101110",
	'E': "111100110100111", 'F': "111100110100100", 'G': "011100101101011", 'H': "101101111101101",
	'I': "111010010010111", 'J': "001001001101010", 'K': "101101110101101", 'L': "100100100100111",
	'M': "101111111101101", 'N': "110101101101101", 'O': "010101101101010", 'P': "110101110100100",
	'Q': "010101101110011", 'R': "110101110101101", 'S': "011100010001110", 'T': "111010010010010",
	'U': "101101101101111", 'V': "101101101101010", 'W': "101101111111101", 'X': "101101010101101",
	'Y': "101101010010010", 'Z': "111001010100111",
	'.': "000000000000010", '%': "101001010100101", '/': "001001010100100", '(': "010100100100010",
	')': "010001001001010", '-': "000000111000000", ':': "000010000010000", ',': "000000000010100",
	'_': "000000000000111", ';': "000010000010100", '=': "000111000111000", '+': "000010111010000",
	' ': "000000000000000", '?': "111001010000010",
}
