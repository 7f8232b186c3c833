// Package option is how an option struct falls back to its defaults: a
// leaf (standard library only) every package may import, as it may import
// cmp.
package option

import (
	"context"
	"errors"
	"time"
)

// A constructor writes, for each optional field,
//
//	opts.Prefix = cmp.Or(opts.Prefix, DefaultPrefix)      // zero is the only unset value
//	opts.MaxRuns = option.PositiveOr(opts.MaxRuns, 256)   // zero or negative means the default
//	opts.Now = option.FuncOr(opts.Now, time.Now)          // a nil function means the default
//
// rather than an if block per field, so the defaults of a struct read as
// one list and every "unset" means the same thing.

// PositiveOr returns v, or def when v is zero or negative: for counts,
// sizes and durations, where a negative value has always meant "the
// default" too (cmp.Or keeps a negative value).
func PositiveOr[T ~int | ~int64 | ~float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// optionFunc lists the function types options default: clocks, sleeps,
// tickers and lookups. cmp.Or cannot take them (functions are not
// comparable); a new kind of function option adds its type here.
type optionFunc interface {
	~func() time.Time |
		~func(context.Context, time.Duration) error |
		~func(time.Duration) (<-chan time.Time, func()) |
		~func(string) string |
		~func(string) []string
}

// FuncOr returns f, or def when f is nil: cmp.Or for function-typed
// options.
func FuncOr[F optionFunc](f, def F) F {
	if f == nil {
		return def
	}
	return f
}

// Required is the error of a constructor whose required option is missing
// ("agent: Options.Model is required"), nil when it is set. A constructor
// checks its options in order with cmp.Or(Required(…), Required(…), …),
// which returns the first error.
func Required(option string, missing bool) error {
	if !missing {
		return nil
	}
	return errors.New(option + " is required")
}
