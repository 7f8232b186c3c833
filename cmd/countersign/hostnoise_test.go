package main_test

// The host-noise meter's switches, on every platform (it runs on Linux:
// hostnoise_linux_test.go): CLICK_HOSTNOISE asks a benchmark for it, and
// COUNTERSIGN_TEST_HOSTNOISE_CPU makes the test binary one of its
// children (TestMain).
const (
	envHostNoise    = "CLICK_HOSTNOISE"
	envHostNoiseCPU = "COUNTERSIGN_TEST_HOSTNOISE_CPU"
)
