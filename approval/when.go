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
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"
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

// ArgType is the type a tool's argument schema gives one argument, as a
// rule reads it: arguments arrive as JSON, so every number (integer or
// not) is a double. ArgAny is a schema that allows more than one type (or
// null), or says none.
type ArgType string

// Argument types for CheckRule.
const (
	ArgAny    ArgType = ""
	ArgString ArgType = "string"
	ArgNumber ArgType = "number"
	ArgBool   ArgType = "boolean"
	ArgList   ArgType = "array"
	ArgObject ArgType = "object"
)

// celType is the CEL type of an argument of type t.
func (t ArgType) celType() *cel.Type {
	switch t {
	case ArgString:
		return cel.StringType
	case ArgNumber:
		return cel.DoubleType
	case ArgBool:
		return cel.BoolType
	case ArgList:
		return cel.ListType(cel.DynType)
	case ArgObject:
		return cel.MapType(cel.StringType, cel.DynType)
	}
	return cel.DynType
}

// CheckRule is CheckWhen with the types of the arguments: each argument
// args gives a type is read as that type (args.env == 1 on a string, a
// boolean compared with "true", a number given to startsWith), so a rule
// that could never match or never be evaluated fails here rather than on
// every call. An argument args leaves out is read as any value: ArgRefs
// finds the names a schema lacks.
func CheckRule(expr string, args map[string]ArgType) error {
	env, err := whenEnv()
	if err != nil {
		return fmt.Errorf("build expression environment: %w", err)
	}
	if strings.TrimSpace(expr) == "" {
		return errors.New("empty expression")
	}
	parsed, iss := env.Parse(expr)
	if iss != nil && iss.Err() != nil {
		return issuesError(iss)
	}
	// Each read of a typed argument becomes a variable of its type; a
	// presence test (has(args.x)) stays a read of the map.
	vars := map[string]string{} // argument → its variable
	var decls []cel.EnvOption
	variable := func(name string) (string, bool) {
		if v, ok := vars[name]; ok {
			return v, true
		}
		t, ok := args[name]
		if !ok || t == ArgAny {
			return "", false
		}
		v := fmt.Sprintf("args·%d", len(vars))
		vars[name] = v
		decls = append(decls, cel.Variable(v, t.celType()))
		return v, true
	}
	fac := celast.NewExprFactory()
	isArgs := func(e celast.Expr) bool { return e.Kind() == celast.IdentKind && e.AsIdent() == "args" }
	celast.PostOrderVisit(parsed.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		name := ""
		switch e.Kind() {
		case celast.SelectKind:
			if sel := e.AsSelect(); isArgs(sel.Operand()) && !sel.IsTestOnly() {
				name = sel.FieldName()
			}
		case celast.CallKind:
			call := e.AsCall()
			if a := call.Args(); call.FunctionName() == operators.Index && len(a) == 2 && isArgs(a[0]) && a[1].Kind() == celast.LiteralKind {
				name, _ = a[1].AsLiteral().Value().(string)
			}
		}
		if v, ok := variable(name); name != "" && ok {
			e.SetKindCase(fac.NewIdent(e.ID(), v))
		}
	}))
	// CEL's equality compares a double with an int by value when the rule
	// runs (args.count == 3, args.count in [1, 2]), which its checker
	// would refuse once the argument is a double: such a literal is
	// checked as the double it equals.
	number := map[string]bool{}
	for name, v := range vars {
		number[v] = args[name] == ArgNumber
	}
	isNumber := func(e celast.Expr) bool { return e.Kind() == celast.IdentKind && number[e.AsIdent()] }
	asDouble := func(e celast.Expr) {
		if e.Kind() != celast.LiteralKind {
			return
		}
		switch v := e.AsLiteral().(type) {
		case types.Int:
			e.SetKindCase(fac.NewLiteral(e.ID(), types.Double(v)))
		case types.Uint:
			e.SetKindCase(fac.NewLiteral(e.ID(), types.Double(v)))
		}
	}
	celast.PostOrderVisit(parsed.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		if e.Kind() != celast.CallKind {
			return
		}
		call := e.AsCall()
		a := call.Args()
		switch fn := call.FunctionName(); {
		case (fn == operators.Equals || fn == operators.NotEquals) && len(a) == 2:
			if isNumber(a[0]) {
				asDouble(a[1])
			}
			if isNumber(a[1]) {
				asDouble(a[0])
			}
		case fn == operators.In && len(a) == 2 && isNumber(a[0]) && a[1].Kind() == celast.ListKind:
			for _, el := range a[1].AsList().Elements() {
				asDouble(el)
			}
		}
	}))
	if len(decls) == 0 {
		return CheckWhen(expr)
	}
	typed, err := env.Extend(decls...)
	if err != nil {
		return fmt.Errorf("build expression environment: %w", err)
	}
	checked, iss := typed.Check(parsed)
	if iss != nil && iss.Err() != nil {
		read := make([]string, 0, len(vars))
		for name := range vars {
			read = append(read, fmt.Sprintf("args.%s is %s", name, argTypeWords(args[name])))
		}
		slices.Sort(read)
		note := ""
		if slices.ContainsFunc(slices.Collect(maps.Keys(vars)), func(name string) bool { return args[name] == ArgNumber }) {
			note = "; arguments arrive as JSON, so a number is a double: compare it with 50 or 50.0, compute with 1.0, or convert with int(…)"
		}
		return fmt.Errorf("%w (the tool's schema: %s%s)", issuesError(iss), strings.Join(read, ", "), note)
	}
	if out := checked.OutputType(); !out.IsExactType(cel.BoolType) && !out.IsExactType(cel.DynType) {
		return fmt.Errorf("must return bool, returns %s", out)
	}
	return nil
}

// argTypeWords is t as a schema says it.
func argTypeWords(t ArgType) string {
	switch t {
	case ArgString:
		return "a string"
	case ArgNumber:
		return "a number"
	case ArgBool:
		return "a boolean"
	case ArgList:
		return "an array"
	case ArgObject:
		return "an object"
	}
	return "any value"
}

// issuesError is a compile's problems in one line, each with its
// line:column.
func issuesError(iss *cel.Issues) error {
	msgs := make([]string, 0, len(iss.Errors()))
	for _, e := range iss.Errors() {
		msg := strings.TrimSuffix(e.Message, " (in container '')")
		msgs = append(msgs, fmt.Sprintf("%d:%d: %s", e.Location.Line(), e.Location.Column()+1, msg))
	}
	return errors.New(strings.Join(msgs, "; "))
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
		return nil, issuesError(iss)
	}
	if out := ast.OutputType(); !out.IsExactType(cel.BoolType) && !out.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("must return bool, returns %s", out)
	}
	// Constant patterns of matches() are compiled once, here, instead of
	// at every evaluation (a suggested rule's pattern cost replay two
	// thirds of its time); a pattern that does not compile is then an
	// error of the policy, named when it is loaded, not a when_error at
	// every call.
	prg, err := env.Program(ast, cel.CostLimit(whenCostLimit), cel.OptimizeRegex(interpreter.MatchesRegexOptimization))
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
