package gpu

import (
	"reflect"
	"testing"
)

func TestSelection(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cases := []struct {
		cfg  []string
		env  map[string]string
		want []string
		none bool
	}{
		{nil, nil, nil, false},
		{[]string{"1"}, map[string]string{"NVIDIA_VISIBLE_DEVICES": "0"}, []string{"1"}, false}, // config wins
		{nil, map[string]string{"NVIDIA_VISIBLE_DEVICES": "0,GPU-abc", "CUDA_VISIBLE_DEVICES": "3"}, []string{"0", "GPU-abc"}, false},
		{nil, map[string]string{"CUDA_VISIBLE_DEVICES": "2, 3"}, []string{"2", "3"}, false},
		{nil, map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}, nil, false},
		{nil, map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}, nil, true},
	}
	for _, c := range cases {
		got, none := Selection(c.cfg, env(c.env))
		if !reflect.DeepEqual(got, c.want) || none != c.none {
			t.Errorf("Selection(%v, %v) = %v, %v; want %v, %v", c.cfg, c.env, got, none, c.want, c.none)
		}
	}
	if !selected([]string{"GPU-abc"}, "4", "GPU-abcdef-1234") || selected([]string{"1"}, "0", "GPU-x") || !selected(nil, "7", "") {
		t.Error("selected() mismatch")
	}
}
