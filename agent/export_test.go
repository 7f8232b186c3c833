package agent

// Truncate exposes truncate to the external tests.
var Truncate = truncate
