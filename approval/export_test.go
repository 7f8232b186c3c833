package approval

// IndexPage and SweepPages are the reminder loop's page size and the
// sweep's pages per tick, for TestRemindersPageABurst.
const (
	IndexPage  = indexPage
	SweepPages = sweepPages
)

// CanonicalAsIs and CanonicalLong are appendCanonicalJSON's two ways, for
// FuzzCanonicalAsIs: a value taken as it is must be what the long way
// writes.
var (
	CanonicalAsIs = canonicalAsIs
	CanonicalLong = func(raw []byte) ([]byte, error) { return appendCanonicalLong(nil, raw) }
)

// DecodeCompact and DecodeJSONLong are decodeJSON's two ways, for
// FuzzDecodeCompact.
var (
	DecodeCompact  = decodeCompact
	DecodeJSONLong = decodeJSONLong
	EncodeJSON     = encodeJSON
)
