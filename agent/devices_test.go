package agent

import (
	"reflect"
	"testing"
)

func TestDevicesAreDisjointAndReused(t *testing.T) {
	d := newDevices(map[string]int{"gpu": 3, "tpu": 1})
	a, err := d.take("a#1", map[string]int{"gpu": 2})
	if err != nil || !reflect.DeepEqual(a, map[string][]int{"gpu": {0, 1}}) {
		t.Fatalf("first replica: %v, %v; want gpu 0,1", a, err)
	}
	b, err := d.take("b#1", map[string]int{"gpu": 1, "tpu": 1})
	if err != nil || !reflect.DeepEqual(b, map[string][]int{"gpu": {2}, "tpu": {0}}) {
		t.Fatalf("second replica: %v, %v; want gpu 2 and tpu 0", b, err)
	}
	if got, err := d.take("c#1", map[string]int{"gpu": 1}); err == nil {
		t.Fatalf("a fourth GPU of three: got %v", got)
	}
	if _, err := d.take("c#1", map[string]int{"gpu": 1, "tpu": 1}); err == nil {
		t.Fatal("all or none: took devices none were free of")
	}
	d.release("a#1")
	c, err := d.take("c#1", map[string]int{"gpu": 1})
	if err != nil || !reflect.DeepEqual(c, map[string][]int{"gpu": {0}}) {
		t.Fatalf("after a#1 stopped: %v, %v; want its gpu 0 again", c, err)
	}
	env := deviceEnv(map[string][]int{"gpu": {2, 0}, "tpu": {0}})
	want := map[string]string{"SERVEMESH_GPU_DEVICES": "0,2", "CUDA_VISIBLE_DEVICES": "0,2", "SERVEMESH_TPU_DEVICES": "0"}
	if !reflect.DeepEqual(env, want) {
		t.Fatalf("environment %v; want %v", env, want)
	}
}
