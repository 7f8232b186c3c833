package approval

// IndexPage and SweepPages are the reminder loop's page size and the
// sweep's pages per tick, for TestRemindersPageABurst.
const (
	IndexPage  = indexPage
	SweepPages = sweepPages
)
