package meshspec

import (
	"reflect"
	"testing"
)

// fill sets every field of v, at every depth, to a value that is not the
// zero one: pointers, slices and maps to fresh non-empty values.
func fill(v reflect.Value, depth int) {
	if depth > 8 {
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), depth+1)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0), depth+1)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, depth+1)
		fill(e, depth+1)
		v.SetMapIndex(k, e)
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint32, reflect.Uint64, reflect.Uint8:
		if v.CanInt() {
			v.SetInt(1)
		} else {
			v.SetUint(1)
		}
	case reflect.Float64, reflect.Float32:
		v.SetFloat(1)
	}
}

// shared reports the first path at which a and b share memory.
func shared(a, b reflect.Value, path string) string {
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return ""
		}
		if a.Pointer() == b.Pointer() {
			return path
		}
		return shared(a.Elem(), b.Elem(), path)
	case reflect.Struct:
		for i := range a.NumField() {
			if a.Type().Field(i).IsExported() {
				if p := shared(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name); p != "" {
					return p
				}
			}
		}
	case reflect.Slice:
		if a.Len() > 0 && b.Len() > 0 && a.Pointer() == b.Pointer() {
			return path
		}
		for i := range min(a.Len(), b.Len()) {
			if p := shared(a.Index(i), b.Index(i), path+"[]"); p != "" {
				return p
			}
		}
	case reflect.Map:
		if !a.IsNil() && a.Pointer() == b.Pointer() {
			return path
		}
		for _, k := range a.MapKeys() {
			if bv := b.MapIndex(k); bv.IsValid() {
				if p := shared(a.MapIndex(k), bv, path+"{}"); p != "" {
					return p
				}
			}
		}
	}
	return ""
}

// TestCloneCopiesEveryField: a model with every field set, at every depth,
// and its Clone share no pointer, slice or map, and are equal: a field
// added to the model that Clone does not copy fails here.
func TestCloneCopiesEveryField(t *testing.T) {
	var m Model
	fill(reflect.ValueOf(&m).Elem(), 0)
	c := Clone(&m)
	if p := shared(reflect.ValueOf(&m).Elem(), reflect.ValueOf(c).Elem(), "Model"); p != "" {
		t.Fatalf("Clone shares %s with the original: a change to one changes the other", p)
	}
	if !reflect.DeepEqual(&m, c) {
		t.Fatalf("Clone differs from the original:\n%+v\n%+v", m, *c)
	}
}
