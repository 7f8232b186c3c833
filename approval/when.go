package approval

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/ext"
)

// This file: the policy's CEL rules (deny, quorum_when, when): compiled
// in one environment with a cost limit, evaluated, and shown to people.

// whenCostLimit bounds the work one rule may do, so a rule over a huge
// argument list cannot stall the gate. Generous for any realistic rule.
const whenCostLimit = 1_000_000

// whenEnv is the CEL environment every rule is compiled in. It is built
// once and is immutable, so sharing it across gates and goroutines is safe.
var whenEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("tool", cel.StringType),
		cel.Variable("requester", cel.StringType),
		// JSON numbers are doubles; let rules compare them with int
		// literals (args.amount > 50) as people naturally write them.
		cel.CrossTypeNumericComparisons(true),
		ext.Strings(),
	)
})

// CheckWhen compiles a when expression the way NewGate does and reports
// why it is not acceptable: a syntax or type error (with line:column), or
// a result type other than bool. The policy file uses it to name the
// offending key.
func CheckWhen(expr string) error {
	_, err := compileWhen(expr)
	return err
}

// ArgRefs returns the argument names expr reads as args.name or
// args["name"], sorted and without repeats, so a policy file can check
// them against the tool's schema. It returns the compile error of an
// invalid expression.
func ArgRefs(expr string) ([]string, error) {
	env, err := whenEnv()
	if err != nil {
		return nil, fmt.Errorf("build expression environment: %w", err)
	}
	checked, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		return nil, iss.Err()
	}
	seen := map[string]bool{}
	isArgs := func(e celast.Expr) bool { return e.Kind() == celast.IdentKind && e.AsIdent() == "args" }
	celast.PostOrderVisit(checked.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		switch e.Kind() {
		case celast.SelectKind:
			if sel := e.AsSelect(); isArgs(sel.Operand()) {
				seen[sel.FieldName()] = true
			}
		case celast.CallKind:
			call := e.AsCall()
			if args := call.Args(); call.FunctionName() == operators.Index && len(args) == 2 && isArgs(args[0]) &&
				args[1].Kind() == celast.LiteralKind {
				if name, ok := args[1].AsLiteral().Value().(string); ok {
					seen[name] = true
				}
			}
		}
	}))
	return slices.Sorted(maps.Keys(seen)), nil
}

func compileWhen(expr string) (cel.Program, error) {
	env, err := whenEnv()
	if err != nil {
		return nil, fmt.Errorf("build expression environment: %w", err)
	}
	if strings.TrimSpace(expr) == "" {
		return nil, errors.New("empty expression")
	}
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		msgs := make([]string, 0, len(iss.Errors()))
		for _, e := range iss.Errors() {
			msg := strings.TrimSuffix(e.Message, " (in container '')")
			msgs = append(msgs, fmt.Sprintf("%d:%d: %s", e.Location.Line(), e.Location.Column()+1, msg))
		}
		return nil, errors.New(strings.Join(msgs, "; "))
	}
	if out := ast.OutputType(); !out.IsExactType(cel.BoolType) && !out.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("must return bool, returns %s", out)
	}
	prg, err := env.Program(ast, cel.CostLimit(whenCostLimit))
	if err != nil {
		return nil, err
	}
	return prg, nil
}

func (r *rule) eval(vars map[string]any) (bool, error) {
	out, _, err := r.prg.Eval(vars)
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("returned %s, not bool", out.Type().TypeName())
	}
	return b, nil
}

// ruleText is a rule that fired, for people: its reason when the policy
// gives one, else the rule in its plainest form.
func ruleText(reason, expr string) string {
	if r := strings.TrimSpace(reason); r != "" {
		return r
	}
	return "rule: " + PlainRule(expr)
}

var (
	// conversions that only satisfy CEL's types: double(args.amount).
	celConversion = regexp.MustCompile(`\b(?:double|int|uint|string)\(([^()]*)\)`)
	celArg        = regexp.MustCompile(`\bargs\.`)
	celWholeFloat = regexp.MustCompile(`\b(\d+)\.0\b`)
	celOperators  = strings.NewReplacer(" && ", " and ", " || ", " or ", " == ", " is ", " != ", " is not ", "!", "not ")
)

// PlainRule renders a CEL rule as plainly as it can without changing what
// it says: "double(args.amount) > 50.0" reads "amount > 50".
func PlainRule(expr string) string {
	s := strings.Join(strings.Fields(expr), " ")
	for prev := ""; prev != s; {
		prev, s = s, celConversion.ReplaceAllString(s, "$1")
	}
	s = celArg.ReplaceAllString(s, "")
	s = celWholeFloat.ReplaceAllString(s, "$1")
	return celOperators.Replace(s)
}
