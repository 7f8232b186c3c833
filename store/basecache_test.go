package store

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// filler sets every exported field reachable from a value to something
// not zero (two elements per slice and map), so that a copy sharing any
// memory with its original is caught by changing one (change).
type filler struct{ n int }

func (f *filler) fill(v reflect.Value, depth int) {
	f.n++
	if v.Type() == reflect.TypeFor[time.Time]() {
		v.Set(reflect.ValueOf(time.Date(2026, 3, 1, 9, 0, f.n, 0, time.UTC)))
		return
	}
	if v.Type() == reflect.TypeFor[json.RawMessage]() {
		v.SetBytes([]byte(fmt.Sprintf(`{"k":%d}`, f.n)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", f.n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(f.n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(f.n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(f.n) + 0.5)
	case reflect.Pointer:
		if depth > 6 {
			return
		}
		n := reflect.New(v.Type().Elem())
		f.fill(n.Elem(), depth+1)
		v.Set(n)
	case reflect.Slice:
		if depth > 6 {
			return
		}
		n := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			f.fill(n.Index(i), depth+1)
		}
		v.Set(n)
	case reflect.Map:
		if depth > 6 {
			return
		}
		n := reflect.MakeMap(v.Type())
		for range 2 {
			k := reflect.New(v.Type().Key()).Elem()
			f.fill(k, depth+1)
			e := reflect.New(v.Type().Elem()).Elem()
			f.fill(e, depth+1)
			n.SetMapIndex(k, e)
		}
		v.Set(n)
	case reflect.Interface:
		v.Set(reflect.ValueOf(fmt.Sprintf("i%d", f.n)))
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				f.fill(v.Field(i), depth+1)
			}
		}
	case reflect.Array:
		for i := range v.Len() {
			f.fill(v.Index(i), depth+1)
		}
	}
}

// change alters every string, number and byte reachable from v in place
// (through pointers, slices and maps, as a caller changing its request
// would), and counts what it changed.
func change(v reflect.Value) int {
	n := 0
	switch v.Kind() {
	case reflect.String:
		if v.CanSet() {
			v.SetString(v.String() + "!")
			n++
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.CanSet() {
			v.SetInt(v.Int() + 1000)
			n++
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if v.CanSet() {
			v.SetUint(v.Uint() + 1)
			n++
		}
	case reflect.Float32, reflect.Float64:
		if v.CanSet() {
			v.SetFloat(v.Float() + 1)
			n++
		}
	case reflect.Bool:
		if v.CanSet() {
			v.SetBool(!v.Bool())
			n++
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			n += change(v.Elem())
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			n += change(v.Index(i))
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(it.Value())
			n += change(e)
			v.SetMapIndex(it.Key(), e) // a value changed in the map the caller holds
		}
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			if v.CanSet() {
				v.Set(reflect.ValueOf(v.Interface().(time.Time).Add(time.Hour)))
				n++
			}
			return n
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				n += change(v.Field(i))
			}
		}
	}
	return n
}

// filledBase is the base of a request with every field filled (filler).
func filledBase(tb testing.TB) []byte {
	tb.Helper()
	var src approval.Request
	(&filler{}).fill(reflect.ValueOf(&src).Elem(), 0)
	b, err := json.Marshal(src)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestBaseCacheCopies: a base decoded through the process's cache is what
// encoding/json makes of it, every time, whatever a caller did to the
// copy it was handed before — every field of approval.Request (a field
// added later included: the filler finds them by reflection) is checked
// by changing everything reachable in one copy.
func TestBaseCacheCopies(t *testing.T) {
	b := filledBase(t)
	base := string(b)
	var want approval.Request
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	c := &baseCache{m: map[string]*approval.Request{}}
	for i := range 3 { // a miss, then hits
		got, err := c.decode(base)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(*got, want) {
			t.Fatalf("decode %d = %+v\nwant %+v", i+1, *got, want)
		}
		if n := change(reflect.ValueOf(got).Elem()); n < 50 {
			t.Fatalf("changed only %d values: the filler did not reach the request's fields", n)
		}
	}
	if len(c.m) != 1 {
		t.Errorf("%d bases cached, want 1", len(c.m))
	}
}

// TestBaseCacheBounded: the cache holds at most maxBases decoded bases.
func TestBaseCacheBounded(t *testing.T) {
	c := &baseCache{m: map[string]*approval.Request{}}
	for i := range maxBases + 10 {
		if _, err := c.decode(fmt.Sprintf(`{"id":"req_%d","tool":"refund"}`, i)); err != nil {
			t.Fatal(err)
		}
		if len(c.m) > maxBases {
			t.Fatalf("%d bases cached, want at most %d", len(c.m), maxBases)
		}
	}
	if _, err := c.decode(`{"id":`); err == nil {
		t.Error("a broken base decoded")
	}
}

// BenchmarkDecodeBase: a base decoded by encoding/json, and through the
// cache (a hit: a deep copy), for a request with every field filled.
//
//	go test ./store -run '^$' -bench DecodeBase
func BenchmarkDecodeBase(b *testing.B) {
	raw := filledBase(b)
	b.Logf("base: %d bytes", len(raw))
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r approval.Request
			if err := json.Unmarshal(raw, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		c := &baseCache{m: map[string]*approval.Request{}}
		base := string(raw)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.decode(base); err != nil {
				b.Fatal(err)
			}
		}
	})
}
