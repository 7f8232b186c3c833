package agent

// MaxUsageBody is maxUsageBody, for TestModelTransportBodyUnchanged.
const MaxUsageBody = maxUsageBody
