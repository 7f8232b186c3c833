package agent

// Truncate exposes truncate to the external tests.
var Truncate = truncate

// MaxUsageBody is maxUsageBody, for TestModelTransportBodyUnchanged.
const MaxUsageBody = maxUsageBody
