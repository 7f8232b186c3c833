package slacksim

import (
	"slices"
	"strings"
)

func (w *Workspace) userJSONLocked(u *User) map[string]any {
	return map[string]any{
		"id":        u.ID,
		"team_id":   TeamID,
		"name":      u.Name,
		"real_name": u.RealName,
		"deleted":   false,
		"is_bot":    u.IsBot,
		"is_admin":  false,
		"tz":        "UTC",
		"tz_offset": 0,
		"profile": map[string]any{
			"real_name":    u.RealName,
			"display_name": u.Name,
			"email":        u.Email,
			"team":         TeamID,
		},
	}
}

func usersInfo(w *Workspace, p params, _ string) (result, func()) {
	u, ok2 := w.users[p["user"]]
	if !ok2 {
		return fail("user_not_found"), nil
	}
	return ok(result{"user": w.userJSONLocked(u)}), nil
}

// usersList lists the workspace's members (bots included) a page at a
// time, as Slack's users.list does.
func usersList(w *Workspace, p params, _ string) (result, func()) {
	from, to, next, errRes := page(p, len(w.userOrder), 100)
	if errRes != nil {
		return errRes, nil
	}
	out := []any{}
	for _, id := range w.userOrder[from:to] {
		out = append(out, w.userJSONLocked(w.users[id]))
	}
	return ok(result{"members": out, "response_metadata": map[string]any{"next_cursor": next}}), nil
}

func usergroupsUsersList(w *Workspace, p params, _ string) (result, func()) {
	g, found := w.groups[p["usergroup"]]
	if !found {
		return fail("no_such_subteam"), nil
	}
	return ok(result{"users": slices.Clone(g.Users)}), nil
}

func usergroupsUsersUpdate(w *Workspace, p params, _ string) (result, func()) {
	g, found := w.groups[p["usergroup"]]
	if !found {
		return fail("no_such_subteam"), nil
	}
	after := w.setGroupUsersLocked(g, strings.Split(p["users"], ","))
	return ok(result{"usergroup": groupJSON(g)}), after
}

func groupJSON(g *Usergroup) map[string]any {
	return map[string]any{
		"id": g.ID, "team_id": TeamID, "handle": g.Handle, "name": g.Name,
		"is_usergroup": true, "users": slices.Clone(g.Users), "user_count": len(g.Users),
	}
}

func usergroupsList(w *Workspace, _ params, _ string) (result, func()) {
	out := []any{}
	ids := make([]string, 0, len(w.groups))
	for id := range w.groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		out = append(out, groupJSON(w.groups[id]))
	}
	return ok(result{"usergroups": out}), nil
}
