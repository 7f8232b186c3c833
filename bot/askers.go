package bot

import (
	"fmt"
	"strings"

	"github.com/countersign/countersign/approval"
)

// askerNames names everyone who asked for r (approval.Request.Askers: the
// requester and everyone else who posted in its task thread since the run
// began), as mentions joined like "@alice, @bob and @dan" (conj "and") or
// "@alice or @bob" (conj "or"). With slackOnly, only Slack user ids are
// named (an API request's internal requester name is not a person). At
// most maxMentions are named; "" when nobody is.
func askerNames(r *approval.Request, conj string, slackOnly bool) string {
	var names []string
	for _, u := range r.Askers() {
		if slackOnly && !slackIDRe.MatchString(u) {
			continue
		}
		names = append(names, mention(u))
	}
	if len(names) > maxMentions {
		names = append(names[:maxMentions], fmt.Sprintf("%d more", len(names)-maxMentions))
	}
	switch len(names) {
	case 0:
		return ""
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " " + conj + " " + names[len(names)-1]
}
