package main

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"testing"
)

func decodePlot(t *testing.T, s []sample, warm float64) image.Image {
	t.Helper()
	var b bytes.Buffer
	if err := plot(&b, s, warm); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds() != image.Rect(0, 0, plotW, plotH) {
		t.Fatalf("bounds %v, want %dx%d", img.Bounds(), plotW, plotH)
	}
	return img
}

// count is the pixels of colour c in the rows [y0, y1).
func count(img image.Image, c color.RGBA, y0, y1 int) int {
	n := 0
	for y := y0; y < y1; y++ {
		for x := range plotW {
			if color.RGBAModel.Convert(img.At(x, y)) == c {
				n++
			}
		}
	}
	return n
}

func TestPlot(t *testing.T) {
	img := decodePlot(t, steady(0.5*mib, 5), 300)
	for i := range panels {
		top := panelTop + i*(panelH+panelGap)
		// The fit is drawn over the series: where the series is
		// constant (the heap's here) it shows only around the fit.
		if n := count(img, lineC, top, top+panelH); n < 100 {
			t.Errorf("panel %d: %d pixels of the series", i, n)
		}
		if n := count(img, fitC, top, top+panelH); n < 500 {
			t.Errorf("panel %d: %d pixels of the fit", i, n)
		}
		if n := count(img, warmC, top, top+panelH); n == 0 {
			t.Errorf("panel %d: the warm-up is not shaded", i)
		}
		if n := count(img, ink, top, top+14); n == 0 {
			t.Errorf("panel %d: no title", i)
		}
	}
	// No sample after the warm-up: no fit is drawn.
	img = decodePlot(t, steady(0, 0)[:20], 300)
	if n := count(img, fitC, 0, plotH); n != 0 {
		t.Errorf("%d pixels of a fit with no sample to fit", n)
	}
	// No sample at all: an empty frame, no panic.
	img = decodePlot(t, nil, 300)
	if n := count(img, lineC, 0, plotH); n != 0 {
		t.Errorf("%d pixels of a series with no sample", n)
	}
}

func TestText(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 40, 20))
	text(img, 0, 0, "1", ink)
	// '1' is 010/110/010/010/111: 8 glyph pixels of scale² each.
	n := 0
	for y := range 20 {
		for x := range 40 {
			if img.RGBAAt(x, y) == ink {
				n++
			}
		}
	}
	if n != 8*scale*scale {
		t.Errorf("'1' drew %d pixels, want %d", n, 8*scale*scale)
	}
	if textWidth("RSS") != 3*(glyphW+1)*scale {
		t.Errorf("textWidth = %d", textWidth("RSS"))
	}
	for _, s := range []string{panels[0].title, panels[1].title, panels[2].title, panels[3].title, "MINUTES", "TOKENTAP SOAK: 8 SAMPLES OVER 0.6 MIN, FIT AFTER 0.2 MIN   FIT +1.5E+03 /H"} {
		for _, ch := range s {
			if _, ok := glyphs[ch]; !ok {
				t.Errorf("%q in %q has no glyph", ch, s)
			}
		}
	}
}
