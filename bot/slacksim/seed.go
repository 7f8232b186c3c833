package slacksim

// DemoCast is the people and places SeedDemo creates.
type DemoCast struct {
	// Requester asks the bot for work in Tasks.
	Requester User
	// Approver and SecondApprover are in Approvals and the Approvers group.
	Approver, SecondApprover User
	// Tasks is the public task channel (everyone and the bot).
	Tasks Channel
	// Approvals is the private approvers-only channel (approvers and the bot).
	Approvals Channel
	// Approvers is the @approvers user group.
	Approvers Usergroup
}

// SeedDemo adds a small standard cast for demos and tests: alice (the
// requester), bob and carol (approvers), #tasks, the private #approvals
// channel and the @approvers group. IDs are fixed so links stay stable.
func (w *Workspace) SeedDemo() DemoCast {
	alice := w.AddUser(User{ID: "U0ALICE01", Name: "alice", RealName: "Alice Archer"})
	bob := w.AddUser(User{ID: "U0BOB0001", Name: "bob", RealName: "Bob Baker"})
	carol := w.AddUser(User{ID: "U0CAROL01", Name: "carol", RealName: "Carol Cole"})
	tasks := w.AddChannel(Channel{ID: "C0TASKS01", Name: "tasks", Members: []string{alice.ID, bob.ID, carol.ID, BotUserID}})
	approvals := w.AddChannel(Channel{ID: "G0APPROV1", Name: "approvals", IsPrivate: true, Members: []string{bob.ID, carol.ID, BotUserID}})
	group := w.AddUsergroup(Usergroup{ID: "S0APPROV1", Handle: "approvers", Name: "Approvers", Users: []string{bob.ID, carol.ID}})
	return DemoCast{Requester: alice, Approver: bob, SecondApprover: carol, Tasks: tasks, Approvals: approvals, Approvers: group}
}
