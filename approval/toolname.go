package approval

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// Refusals of a tool's name (Lifecycle.Propose): a call is judged by the
// rule of the tool the policy names, never by a look-alike's.
var (
	// ErrInvalidToolName: the name is not 1 to 64 of A-Z a-z 0-9 _ . -
	// (MCP's rule for tool names): no spaces, no emoji, no letters of
	// other scripts that could pass for Latin ones.
	ErrInvalidToolName = errors.New("approval: invalid tool name")
	// ErrConfusableTool: the name is not a declared tool's but reads like
	// one (case, separators, look-alike characters, or a slip of an edit
	// or two: Confusable); the error names the declared tool.
	ErrConfusableTool = errors.New("approval: tool name confusable with a declared tool")
)

// toolNameRe is MCP's rule for a tool's name.
var toolNameRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// CheckToolName refuses a tool name a caller may not use: one outside
// MCP's charset (ErrInvalidToolName), or one that is not in declared but
// reads like a declared tool (Confusable: ErrConfusableTool, wrapped with
// a message naming that tool). A declared name is always accepted, however
// close to another declared one (get_order and get_orders may both be
// declared): the rule is for names the policy does not know.
func CheckToolName(name string, declared []string) error {
	if !toolNameRe.MatchString(name) {
		return fmt.Errorf("tool name %q: %w: a tool name is 1 to 64 of the characters A-Z a-z 0-9 _ . -", name, ErrInvalidToolName)
	}
	if d, ok := lookalike(name, declared); ok {
		return fmt.Errorf("tool name %q looks like the declared tool %q but is not it: %w", name, d, ErrConfusableTool)
	}
	return nil
}

// lookalike returns the declared tool that name, not itself declared,
// reads like (Confusable), if any.
func lookalike(name string, declared []string) (string, bool) {
	if slices.Contains(declared, name) {
		return "", false
	}
	skel := []rune(ToolSkeleton(name))
	for _, d := range declared {
		if skeletonsNear(skel, []rune(ToolSkeleton(d))) {
			return d, true
		}
	}
	return "", false
}

// Confusable reports whether tool names a and b read alike: their
// skeletons (ToolSkeleton) are equal, or differ by at most the edits a
// reader skims over (skeletonEdits: one from 5 characters, two from 16;
// an edit is a character inserted, deleted, replaced, or two neighbours
// swapped). It is symmetric, and true for a name and itself. Its cost is
// linear in the names' length.
func Confusable(a, b string) bool {
	return skeletonsNear([]rune(ToolSkeleton(a)), []rune(ToolSkeleton(b)))
}

func skeletonsNear(a, b []rune) bool {
	limit := skeletonEdits(min(len(a), len(b)))
	return editDistance(a, b, limit) <= limit
}

// skeletonEdits is how many edits two skeletons, the shorter n characters
// long, may differ by and still read alike: none below 5 characters (get
// and set are different words), one from 5 (issue_refund and
// issue_refunds), two from 16.
func skeletonEdits(n int) int {
	switch {
	case n < 5:
		return 0
	case n < 16:
		return 1
	}
	return 2
}

// ToolSkeleton is what a tool's name looks like to a reader: every
// character folded to the ASCII letter or digit it passes for (confusables,
// before and after case folding), lower case, without the separators
// _ - . and space, with ASCII look-alikes made one (skeletonPairs: cl as
// d; rn and nn as m; vv as w; c as e; v as u; 0 as o; 1 and i as l; 5 as
// s; 7 as t). Two names with the same skeleton are confusable. Names
// outside MCP's charset never reach it from CheckToolName (refused first);
// other characters are folded as Unicode's confusables say, for any other
// caller. ToolSkeleton(ToolSkeleton(s)) == ToolSkeleton(s).
func ToolSkeleton(name string) string {
	if !utf8.ValidString(name) {
		name = strings.ToValidUTF8(name, "\uFFFD")
	}
	s := strings.Map(fold, strings.ToLower(strings.Map(fold, name)))
	s = strings.Map(func(r rune) rune {
		switch r {
		case '_', '-', '.', ' ':
			return -1
		}
		return r
	}, s)
	return skeletonPairs.Replace(s)
}

// fold maps r to the ASCII character it passes for (confusables), or
// leaves it.
func fold(r rune) rune {
	if p, ok := confusables[r]; ok {
		return p
	}
	return r
}

// skeletonPairs map the ASCII characters, and runs of them, that pass for
// another to it, after case folding and without separators. A longer run
// is tried before a single character at the same place (cl before c), so
// the result never holds one of these keys again.
var skeletonPairs = strings.NewReplacer(
	"cl", "d", "rn", "m", "nn", "m", "vv", "w",
	"c", "e", "v", "u",
	"0", "o", "1", "l", "i", "l", "5", "s", "7", "t",
)

// confusables is the part of Unicode's confusables data (UTS #39,
// confusables.txt 10.0.0, its "MA" entries) whose prototype is one ASCII
// letter or digit, for the scripts whose letters pass for Latin ones in a
// name: the Latin extensions and small capitals, Greek, Cyrillic and
// Armenian. Upper case prototypes are kept as the file has them;
// ToolSkeleton folds case after. Characters the file maps to more than one
// (Ы → bl) or to punctuation are left out, as are the other scripts: a
// tool's name holds none of them (CheckToolName refuses them first), and
// these are the ones a look-alike name would borrow.
var confusables = map[rune]rune{
	// Latin
	'ı': 'i', 'ſ': 'f', 'Ƅ': 'b', 'ƍ': 'g', 'Ɩ': 'l', 'Ʀ': 'R', 'Ƨ': '2', 'Ʒ': '3', 'Ƽ': '5', 'ƽ': 's',
	'ǀ': 'l', 'Ȝ': '3', 'Ȣ': '8', 'ȣ': '8', 'ɑ': 'a', 'ɡ': 'g', 'ɣ': 'y', 'ɩ': 'i', 'ɪ': 'i', 'ɯ': 'w',
	'ʋ': 'u', 'ʏ': 'y', 'ᴄ': 'c', 'ᴏ': 'o', 'ᴑ': 'o', 'ᴜ': 'u', 'ᴠ': 'v', 'ᴡ': 'w', 'ᴢ': 'z',
	// Greek
	'Ϳ': 'J', 'Α': 'A', 'Β': 'B', 'Ε': 'E', 'Ζ': 'Z', 'Η': 'H', 'Ι': 'l', 'Κ': 'K', 'Μ': 'M', 'Ν': 'N',
	'Ο': 'O', 'Ρ': 'P', 'Τ': 'T', 'Υ': 'Y', 'Χ': 'X', 'α': 'a', 'γ': 'y', 'ι': 'i', 'ν': 'v', 'ο': 'o',
	'ρ': 'p', 'σ': 'o', 'υ': 'u', 'ϒ': 'Y', 'Ϝ': 'F', 'ϱ': 'p', 'ϲ': 'c', 'ϳ': 'j', 'Ϲ': 'C', 'Ϻ': 'M',
	// Cyrillic
	'Ѕ': 'S', 'І': 'l', 'Ј': 'J', 'А': 'A', 'В': 'B', 'Е': 'E', 'З': '3', 'К': 'K', 'М': 'M', 'Н': 'H',
	'О': 'O', 'Р': 'P', 'С': 'C', 'Т': 'T', 'У': 'Y', 'Х': 'X', 'Ь': 'b', 'а': 'a', 'б': '6', 'г': 'r',
	'е': 'e', 'о': 'o', 'р': 'p', 'с': 'c', 'у': 'y', 'х': 'x', 'ѕ': 's', 'і': 'i', 'ј': 'j', 'ѡ': 'w',
	'Ѵ': 'V', 'ѵ': 'v', 'Ү': 'Y', 'ү': 'y', 'һ': 'h', 'ҽ': 'e', 'Ӏ': 'l', 'ӏ': 'i', 'Ӡ': '3', 'ԁ': 'd',
	'Ԍ': 'G', 'ԛ': 'q', 'Ԝ': 'W', 'ԝ': 'w',
	// Armenian
	'Ս': 'U', 'Տ': 'S', 'Օ': 'O', 'ա': 'w', 'գ': 'q', 'զ': 'q', 'հ': 'h', 'ո': 'n', 'ռ': 'n', 'ս': 'u',
	'ց': 'g', 'ք': 'f', 'օ': 'o',
}

// editDistance is the optimal string alignment distance between a and b
// (each character inserted, deleted or replaced, or two neighbours
// swapped, is one edit), or limit+1 when it is more than limit. Only the
// cells within limit of the diagonal are computed, three rows of
// 2·limit+1 at a time, so its cost is bounded by len(a)·(2·limit+1)
// whatever the names' length. It is symmetric.
func editDistance(a, b []rune, limit int) int {
	limit = max(limit, 0)
	far := limit + 1
	if d := len(a) - len(b); d > limit || -d > limit {
		return far
	}
	w := 2*limit + 1
	// rows[i%3][j-i+limit] is the distance between a[:i] and b[:j], for
	// |i-j| <= limit.
	rows := [3][]int{make([]int, w), make([]int, w), make([]int, w)}
	at := func(i, j int) int {
		if j < 0 || j > len(b) || j-i > limit || i-j > limit {
			return far
		}
		return rows[i%3][j-i+limit]
	}
	for j := range w {
		rows[0][j] = far
	}
	for j := 0; j <= min(limit, len(b)); j++ {
		rows[0][j+limit] = j
	}
	for i := 1; i <= len(a); i++ {
		row := rows[i%3]
		best := far
		for k := range w {
			j := i - limit + k
			if j < 0 || j > len(b) {
				row[k] = far
				continue
			}
			d := far
			if j == 0 {
				d = i
			} else {
				cost := 1
				if a[i-1] == b[j-1] {
					cost = 0
				}
				d = min(at(i-1, j)+1, at(i, j-1)+1, at(i-1, j-1)+cost)
				if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
					d = min(d, at(i-2, j-2)+1)
				}
			}
			d = min(d, far)
			row[k] = d
			best = min(best, d)
		}
		if best > limit {
			return far
		}
	}
	return at(len(a), len(b))
}
