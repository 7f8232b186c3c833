package store

import (
	"encoding/json"
	"reflect"
	"sync"

	"github.com/countersign/countersign/approval"
)

// maxBases bounds the decoded bases a process keeps (baseCache): a click
// decodes its request four times within milliseconds (the bot's read,
// the decision's reply, the agent's wake-up, the claim's reply), so a
// small cache holds nearly every repeat; a few KiB each.
const maxBases = 256

// baseCache decodes a record's base field (the part written when the
// request is created, rewritten only by an escalation) once per process:
// keyed by the field's bytes, so a new base is a new entry and a hit is
// exactly what decoding those bytes gives. Every caller gets its own deep
// copy (copyRequest): callers change the requests they are handed.
// Decoding the same base with encoding/json was a tenth of a click's CPU
// (docs/performance.md).
type baseCache struct {
	mu sync.Mutex
	m  map[string]*approval.Request // never handed out
}

var bases = &baseCache{m: map[string]*approval.Request{}}

// decode returns base decoded into a new Request of the caller's.
func (c *baseCache) decode(base string) (*approval.Request, error) {
	c.mu.Lock()
	cached := c.m[base]
	c.mu.Unlock()
	if cached != nil {
		return copyRequest(cached), nil
	}
	r := new(approval.Request)
	if err := json.Unmarshal([]byte(base), r); err != nil {
		return nil, err
	}
	kept := copyRequest(r)
	c.mu.Lock()
	if len(c.m) >= maxBases {
		clear(c.m) // bounded; the next reads decode again
	}
	c.m[base] = kept
	c.mu.Unlock()
	return r, nil
}

// copyRequest returns a copy of r that shares no mutable memory with it.
func copyRequest(r *approval.Request) *approval.Request {
	out := new(approval.Request)
	deepCopy(reflect.ValueOf(out).Elem(), reflect.ValueOf(r).Elem())
	return out
}

// deepCopy sets dst (settable, of src's type) to a copy of src: every
// pointer, slice, map and interface reachable through exported fields is
// copied, so nothing changed through one is seen through the other.
// Unexported fields are copied by value (time.Time's location, which is
// never changed).
func deepCopy(dst, src reflect.Value) {
	if !sharesMemory(src.Type()) {
		dst.Set(src) // strings, numbers, times: a copy shares nothing
		return
	}
	switch src.Kind() {
	case reflect.Pointer:
		if src.IsNil() {
			dst.SetZero()
			return
		}
		n := reflect.New(src.Type().Elem())
		deepCopy(n.Elem(), src.Elem())
		dst.Set(n)
	case reflect.Slice:
		if src.IsNil() {
			dst.SetZero()
			return
		}
		n := reflect.MakeSlice(src.Type(), src.Len(), src.Len())
		if src.Type().Elem().Kind() == reflect.Uint8 {
			reflect.Copy(n, src) // json.RawMessage, []byte
		} else {
			for i := range src.Len() {
				deepCopy(n.Index(i), src.Index(i))
			}
		}
		dst.Set(n)
	case reflect.Map:
		if src.IsNil() {
			dst.SetZero()
			return
		}
		n := reflect.MakeMapWithSize(src.Type(), src.Len())
		for it := src.MapRange(); it.Next(); {
			k := reflect.New(src.Type().Key()).Elem()
			deepCopy(k, it.Key())
			v := reflect.New(src.Type().Elem()).Elem()
			deepCopy(v, it.Value())
			n.SetMapIndex(k, v)
		}
		dst.Set(n)
	case reflect.Interface:
		if src.IsNil() {
			dst.SetZero()
			return
		}
		v := reflect.New(src.Elem().Type()).Elem()
		deepCopy(v, src.Elem())
		dst.Set(v)
	case reflect.Struct:
		dst.Set(src)
		for _, i := range sharingFields(src.Type()) {
			deepCopy(dst.Field(i), src.Field(i))
		}
	case reflect.Array:
		for i := range src.Len() {
			deepCopy(dst.Index(i), src.Index(i))
		}
	default:
		dst.Set(src)
	}
}

// sharing memoizes, per type, whether a value of it can share memory with
// its copy (sharesMemory) and, for a struct, which exported fields can
// (sharingFields): deepCopy walks only those, where it walked every field
// of every struct by reflection before (a twentieth of a click's CPU).
var sharing sync.Map // reflect.Type → *shareInfo

type shareInfo struct {
	shares bool
	fields []int // a struct's exported fields that share
}

// sharesMemory reports whether a value of type t reaches a pointer, slice,
// map or interface through exported fields (deepCopy copies what it
// reaches).
func sharesMemory(t reflect.Type) bool { return shareOf(t).shares }

// sharingFields are the indexes of struct type t's exported fields whose
// values can share memory.
func sharingFields(t reflect.Type) []int { return shareOf(t).fields }

func shareOf(t reflect.Type) *shareInfo {
	if v, ok := sharing.Load(t); ok {
		return v.(*shareInfo)
	}
	info := &shareInfo{}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Interface:
		info.shares = true
	case reflect.Array:
		info.shares = sharesMemory(t.Elem())
	case reflect.Struct:
		// A struct reaches itself only through a pointer, slice or map,
		// which share without looking further: no cycle here.
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() && sharesMemory(f.Type) {
				info.fields = append(info.fields, i)
			}
		}
		info.shares = len(info.fields) > 0
	}
	v, _ := sharing.LoadOrStore(t, info)
	return v.(*shareInfo)
}
